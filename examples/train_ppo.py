"""Train an LLM policy with PPO against the simulated user (RLVER, arXiv 2507.03112).

    python examples/train_ppo.py --recipe agents/smollm2-cpu-ppo.yaml
    python examples/train_ppo.py --recipe agents/qwen2.5-7b-ppo.yaml total_steps=300 learning_rate=2e-6
    python examples/train_ppo.py --recipe agents/smollm2-cpu-ppo.yaml --resume

Any recipe field can be overridden as ``key=value`` (nested: ``policy.lora_r=8``,
``env.kwargs.max_turns=4``). Writes to ``output_dir``: ``metrics.jsonl``, ``tb/``
(TensorBoard), ``episodes.jsonl`` (every finished dialogue), ``transcripts/``,
``checkpoints/`` (every ``save_steps`` and on Ctrl-C) and ``curves.png``.
"""

from empathy_gym.agents.cli import train_main

if __name__ == "__main__":
    raise SystemExit(train_main("ppo"))
