"""Writes tests/data/rollouts_pinned.json: two training steps of every recipe variant on the
tiny model (dialogues, token ids, loss masks, rewards, emotions and endings as digests, and
the step metrics), so that a redesign that must keep behaviour (issue 38) can be checked to
keep it, byte for byte. Pin at the commit before the change, check after it:

    python tests/pin_rollouts.py            # at the commit before the change
    pytest tests/test_pinned_rollouts.py    # after it

Sampling runs on float logits, so the pin holds on the machine and library versions that
wrote it (recorded in the file); elsewhere the test skips and says so.
"""

from __future__ import annotations

import hashlib
import json
import platform
import tempfile
from pathlib import Path

PINNED = Path(__file__).parent / "data" / "rollouts_pinned.json"
RECIPE = Path(__file__).parents[1] / "agents" / "tiny-cpu.yaml"
STEPS = 2
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "ppo": ("ppo", []),
    "ppo-separate-critic-lora": ("ppo", ["critic=separate", "policy.use_lora=true", "policy.lora_r=4"]),
    "ppo-final-reward": ("ppo", ["env.kwargs.reward_mode=final", "env.kwargs.max_turns=3"]),
    "ppo-think": ("ppo", ["generation.think=true", "generation.max_new_tokens=8"]),
    "ppo-context-cut": ("ppo", ["generation.max_context_tokens=300", "env.kwargs.max_turns=6"]),
    "grpo": ("grpo", ["rollout_batch_size=8"]),
    "grpo-reward-to-go-kl": ("grpo", ["rollout_batch_size=8", "advantage=reward_to_go", "beta=0.1"]),
    "grpo-dynamic-sampling": ("grpo", ["rollout_batch_size=8", "dynamic_sampling_budget=2"]),
    "grpo-final-dr": ("grpo", ["rollout_batch_size=8", "env.kwargs.reward_mode=final", "loss_type=dr_grpo"]),
}
TRAJECTORY_FIELDS = (
    "key group env_seed persona_id token_ids loss_mask turn_ends rewards emotions termination format_errors "
    "cut_turns thinking_tokens reply_tokens round"
).split()
UNTIMED = ("time/", "tokens/generated_per_second", "memory/", "system/")
SIMD = ("sse", "avx", "amx", "fma", "f16c")  # what picks torch's CPU kernels


def machine() -> dict[str, str]:
    """What the pin depends on besides the code: the CPU and the numeric libraries."""
    import torch
    import transformers

    cpu, flags = platform.processor(), ""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
        vector = sorted({f for line in info if line.startswith("flags") for f in line.split() if f.startswith(SIMD)})
        flags = " ".join(vector)
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "vector instructions": flags,
        "torch threads": str(torch.get_num_threads()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def play(variant: str) -> dict:
    """Two steps of ``variant``: per step, a SHA-256 of each trained trajectory's fields
    (``TRAJECTORY_FIELDS``) and the step's metrics but timings, rounded to 6 digits."""
    from empathy_gym.agents import TRAINERS, load_recipe

    algorithm, overrides = VARIANTS[variant]
    steps: list[list[str]] = []

    class Recording(TRAINERS[algorithm]):
        def _rollout(self, step):
            played = super()._rollout(step)
            if played is not None:
                steps.append([_digest({f: getattr(t, f) for f in TRAJECTORY_FIELDS}) for t in played[1]])
            return played

    with tempfile.TemporaryDirectory() as out:
        settings = [f"total_steps={STEPS}", f"output_dir={out}", "progress=false", "save_steps=0", *overrides]
        metrics = Recording(load_recipe(RECIPE, settings, algorithm=algorithm)).train()
    kept = [
        {key: _rounded(value) for key, value in sorted(row.items()) if not key.startswith(UNTIMED)} for row in metrics
    ]
    return {"trajectories": steps, "metrics": kept}


def _rounded(value: object) -> object:
    return round(value, 6) if isinstance(value, float) else value


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


if __name__ == "__main__":
    pinned = {"machine": machine(), "variants": {name: play(name) for name in VARIANTS}}
    PINNED.write_text(json.dumps(pinned, indent=1) + "\n")
    print(f"wrote {PINNED}")
