"""Train an LLM policy with GRPO against the simulated user (RLVER, arXiv 2507.03112).

    python examples/train_grpo.py --recipe agents/tiny-cpu.yaml num_generations=4
    python examples/train_grpo.py --recipe agents/qwen2.5-7b-grpo.yaml

Same options and outputs as ``train_ppo.py``; a group of ``num_generations`` dialogues
shares one persona and opening line.
"""

from empathy_gym.agents.cli import train_main

if __name__ == "__main__":
    raise SystemExit(train_main("grpo"))
