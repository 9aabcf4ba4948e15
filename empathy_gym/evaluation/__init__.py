"""Evaluation and replay: the Sentient benchmark (:mod:`~empathy_gym.evaluation.benchmark`,
``empathy-gym eval``), the agents it scores (:mod:`~empathy_gym.evaluation.policies`,
:mod:`~empathy_gym.evaluation.baselines`), re-judging logged dialogues with another user
(:mod:`~empathy_gym.evaluation.replay`, ``empathy-gym replay``, reading SAGE's logs with
:mod:`~empathy_gym.evaluation.sage_logs` and ours with
:mod:`~empathy_gym.evaluation.own_logs`), and the run folder both write
(:mod:`~empathy_gym.evaluation.run_folder`)."""
