"""empathy-gym: Gymnasium environments with simulated users for training emotionally
intelligent LLM agents with reinforcement learning (RLVER, arXiv 2507.03112).

``import empathy_gym`` registers the built-in ids (docs/environment.md) and imports
neither torch, transformers nor vllm.
"""

from empathy_gym.personas import CHARACTER_TYPES, INTENTIONS, Persona, PersonaError, load_personas
from empathy_gym.registration import BUILTIN_IDS, register_builtin_envs, register_persona_env
from empathy_gym.user import EmotionProtocol, SimulatorError, make_user

__version__ = "0.1.0"

register_builtin_envs()

__all__ = [
    "BUILTIN_IDS",
    "CHARACTER_TYPES",
    "EmotionProtocol",
    "INTENTIONS",
    "Persona",
    "PersonaError",
    "SimulatorError",
    "load_personas",
    "make_user",
    "register_persona_env",
    "__version__",
]
