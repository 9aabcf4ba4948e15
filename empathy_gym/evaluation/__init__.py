"""Evaluation and replay: the Sentient benchmark (``empathy-gym eval``,
:mod:`~empathy_gym.evaluation.benchmark`), its policies and baselines, and re-judging logged
dialogues with another user (``empathy-gym replay``, :mod:`~empathy_gym.evaluation.replay`)."""
