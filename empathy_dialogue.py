"""The verifiers plugin module of empathy-gym: the taskset (and environment) id
``empathy-dialogue``.

verifiers (>= 0.4) finds a taskset by importing the top-level module named after its id
(``-`` read as ``_``) and taking the ``Taskset`` and ``Env`` subclasses that its
``__all__`` exports, so ``vf-eval empathy-dialogue ...`` and prime-rl env servers load
empathy-gym's dialogues from here. The code lives in
:mod:`empathy_gym.integrations.verifiers`; importing this module needs verifiers
(``pip install 'empathy-gym[verifiers]'``).
"""

from empathy_gym.integrations.verifiers import EmpathyEnv, EmpathyTaskset

__all__ = ["EmpathyEnv", "EmpathyTaskset"]
