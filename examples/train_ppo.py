"""Train an LLM policy with PPO against the simulated user (RLVER, arXiv 2507.03112).

    python examples/train_ppo.py --recipe agents/smollm2-cpu-ppo.yaml
    python examples/train_ppo.py --recipe agents/qwen2.5-7b-ppo.yaml total_steps=300 learning_rate=2e-6
    python examples/train_ppo.py --recipe agents/smollm2-cpu-ppo.yaml --resume

Any recipe field can be overridden as ``key=value`` (nested: ``policy.lora_r=8``,
``env.kwargs.max_turns=4``). Writes to ``output_dir``: ``metrics.jsonl``, ``tb/``
(TensorBoard), ``episodes.jsonl`` (every finished dialogue), ``transcripts/``,
``checkpoints/`` (every ``save_steps`` and on Ctrl-C) and ``curves.png``.
"""

import sys

if __name__ == "__main__":
    try:
        from empathy_gym.agents.cli import train_main  # imports torch and transformers: seconds

        code = train_main("ppo")
    except KeyboardInterrupt:  # Ctrl-C while importing: nothing started, nothing to save
        print("\nstopped before the first step", file=sys.stderr)
        code = 130
    raise SystemExit(code)
