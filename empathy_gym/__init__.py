"""empathy-gym: Gymnasium environments with simulated users for training empathetic
LLM agents with reinforcement learning (RLVER, arXiv 2507.03112)."""

__version__ = "0.1.0"
