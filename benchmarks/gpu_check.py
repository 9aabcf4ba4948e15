"""The one-GPU check: RLVER's PPO recipe on one device, with the simulated user served
by the policy's own base weights, measured step by step next to its memory plan.

    python benchmarks/gpu_check.py --out benchmarks/results/gpu_check_h200.txt   # one H200, < 8 minutes
    python benchmarks/gpu_check.py --tiny --device cpu                           # the same path, tiny shape

What runs (the defaults): a Qwen2.5-7B-shaped model with random weights built from its
configuration (28 layers, hidden 3584, 28 / 4 heads, MLP 18944, vocabulary 152064; no
hub is reachable there) in bfloat16, LoRA r=64 on every linear layer, gradient
checkpointing, SDPA attention, a separate critic (a second random backbone, no LM head)
as ``agents/qwen2.5-7b-ppo.yaml``, the transformers generation engine, and
``env.kwargs.user: {backend: policy}``: the user is the same model with its adapters off. Two PPO
steps of 16 dialogues x 4 turns with replies of up to 128 tokens. The tokenizer is the
tiny model's (:mod:`empathy_gym.backends.tiny`, ChatML, 2,050 ids, all inside the vocabulary).
Timing and memory do not depend on the weights' values, but what the user says does: a
random model writes no JSON, so the user appraises by scoring options
(``user.appraisal_mode: choice``) and its replies run to ``--user-tokens``; with a real
instruct model in ``free`` mode the user also writes its analysis, so its time here is a
lower bound.

Prints: the memory plan (:mod:`empathy_gym.agents.memory`), then per step the seconds of
generation, user and update, the policy's generation tokens/s, and peak GPU memory
(allocated and reserved), then the plan's total beside the measured peak.

The machine needs torch, transformers, peft and accelerate (the H200 has them) and,
from our requirements, gymnasium, jsonschema and omegaconf with their dependencies. Where
those are missing, run ``bash benchmarks/gpu_wheels.sh`` on a machine with a package
index first and carry ``benchmarks/gpu_wheels`` (about 3 MB): this script unpacks the
wheels that fit its Python into a temporary folder (no pip, no index needed).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / "benchmarks" / "gpu_wheels"
#: Modules the trainer, the env and the LLM user import beyond torch, transformers, peft
#: and accelerate (and what those bring: numpy, pyyaml, tqdm, safetensors, packaging).
NEEDED = ("gymnasium", "jsonschema", "omegaconf")

QWEN25_7B = dict(
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
TINY = dict(
    QWEN25_7B,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=4096,
)


def unpack_wheels(folder: Path, target: Path) -> list[str]:
    """Unpack every wheel in ``folder`` that fits this interpreter (its tags, by
    ``packaging.tags``; one per project, the first that fits) into ``target``, which
    then imports like site-packages. Returns the wheels' file names."""
    from packaging.tags import sys_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename

    supported = set(sys_tags())
    chosen: dict[str, Path] = {}
    for wheel in sorted(folder.glob("*.whl")):
        name, _, _, tags = parse_wheel_filename(wheel.name)
        if tags & supported:
            chosen.setdefault(canonicalize_name(name), wheel)
    for wheel in chosen.values():
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
    return sorted(w.name for w in chosen.values())


def ensure_dependencies(folder: Path = WHEELS) -> list[str]:
    """Make :data:`NEEDED` importable: from the environment, else from the carried wheels.

    Returns:
        The wheels unpacked (empty when nothing was missing).

    Raises:
        SystemExit: something is missing and there are no wheels to take it from.
    """
    missing = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if not missing:
        return []
    if not folder.is_dir():
        raise SystemExit(
            f"missing {missing}: run `bash benchmarks/gpu_wheels.sh` where pip can reach an index, "
            f"and bring {folder.relative_to(REPO)} along"
        )
    target = Path(tempfile.mkdtemp(prefix="gpu-check-site-"))
    unpacked = unpack_wheels(folder, target)
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    still = [name for name in NEEDED if importlib.util.find_spec(name) is None]
    if still:
        raise SystemExit(f"still missing {still} after unpacking {unpacked} from {folder}")
    return unpacked


def build_policy(shape: dict, device, dtype):
    """A randomly initialised ``Qwen2ForCausalLM`` of ``shape``, created on ``device`` in
    ``dtype`` directly (no float32 copy on the way)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**shape, attn_implementation="sdpa")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model


def step_clock(started: float):
    """A trainer callback that prints each step as it ends, so that a run cut off by the
    machine's time limit still shows how far it got (the table comes only at the end).
    Built here, not at import: the package imports only once :func:`ensure_dependencies` ran."""
    from empathy_gym.agents.callbacks import TrainerCallback

    class StepClock(TrainerCallback):
        def on_step_end(self, trainer, step: int, trajectories) -> None:
            print(f"step {step} ended at {time.perf_counter() - started:.0f} s", flush=True)

    return StepClock()


def gib(value: float | None) -> str:
    """A table cell: GiB to two decimals, ``-`` where nothing was measured (CPU)."""
    return "-" if value is None else f"{value:.2f}"


def recipe(args: argparse.Namespace, output_dir: str):
    """``agents/qwen2.5-7b-ppo.yaml`` with this check's workload."""
    from empathy_gym.agents import load_recipe

    config = load_recipe(
        REPO / "agents" / "qwen2.5-7b-ppo.yaml",
        [
            f"output_dir={output_dir}",
            f"total_steps={args.steps}",
            f"rollout_batch_size={args.dialogues}",
            f"num_mini_batches={4 if args.dialogues % 4 == 0 else 1}",
            f"critic={args.critic}",
            "save_steps=0",
            "report_to=none",
            "progress=false",
            "transcripts_per_step=0",
            f"policy.device={args.device}",
            f"policy.dtype={'bfloat16' if args.device != 'cpu' else 'float32'}",
            "generation.engine=transformers",
            f"generation.max_new_tokens={args.reply_tokens}",
            f"generation.max_context_tokens={args.context}",
            "generation.think=false",
        ],
        algorithm="ppo",
    )
    config.env.kwargs = {
        "user": {
            "backend": "policy",
            "appraisal_mode": "choice",
            "user_kwargs": {"max_tokens": args.user_tokens, "reply_plan": False},
        },
        "protocol": "rlver_training",
        "reward_mode": "final",
        "max_turns": args.turns,
    }
    config.env.personas = args.personas
    return config


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of the same family (a CPU test)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--dialogues", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--reply-tokens", type=int, default=128, help="the policy's max_new_tokens")
    parser.add_argument("--user-tokens", type=int, default=128, help="the user's reply max_tokens")
    parser.add_argument("--context", type=int, default=4096, help="generation.max_context_tokens")
    parser.add_argument("--critic", choices=("separate", "shared"), default="separate")
    parser.add_argument("--personas", default="en", help="persona bank (the tiny tokenizer reads en and zh)")
    parser.add_argument("--out", help="also write the report here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    unpacked = ensure_dependencies()
    sys.path.insert(0, str(REPO))

    import torch
    import transformers

    import empathy_gym.agents.ppo as ppo
    from empathy_gym.agents import PPOTrainer
    from empathy_gym.backends.models import resolve_model

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = TINY if args.tiny else QWEN25_7B
    torch.manual_seed(0)
    from transformers import AutoTokenizer, Qwen2Config, Qwen2Model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("tiny")[0])
    if len(tokenizer) > shape["vocab_size"]:
        raise SystemExit(f"the tokenizer's {len(tokenizer)} ids do not fit the vocabulary of {shape['vocab_size']}")
    model = build_policy(shape, device, dtype)

    def random_backbone(name, *, dtype=None, device=None, attn_implementation=None):
        """The separate critic's backbone: random too, of the same shape (no hub)."""
        previous = torch.get_default_dtype()
        torch.set_default_dtype(model.dtype)
        try:
            with torch.device(device):
                return Qwen2Model(Qwen2Config(**shape, attn_implementation="sdpa"))
        finally:
            torch.set_default_dtype(previous)

    ppo.load_backbone = random_backbone
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as output_dir:
        trainer = PPOTrainer(
            recipe(args, output_dir), model=model, tokenizer=tokenizer, callbacks=[step_clock(started)]
        )
        built = time.perf_counter()
        print(f"built in {built - started:.0f} s", flush=True)
        metrics = trainer.train()
        plan = trainer.memory_plan
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    try:
        import peft

        versions += f", peft {peft.__version__}"
    except ImportError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"gpu check: {'tiny' if args.tiny else 'Qwen2.5-7B'}-shaped Qwen2 (random weights), "
        f"{str(dtype).replace('torch.', '')}, LoRA r={trainer.config.policy.lora_r} (all linear), "
        f"{args.critic} critic, gradient checkpointing, transformers engine, user: policy (adapters off)",
        f"device: {name}; {versions}; python {platform.python_version()}; load average {load}",
        f"workload: {args.dialogues} dialogues x {args.turns} turns, replies <= {args.reply_tokens} tokens, "
        f"user replies <= {args.user_tokens} tokens, personas {args.personas}; "
        f"mean dialogue {sum(m['tokens/sequence_mean'] for m in metrics) / max(1, len(metrics)):.0f} tokens",
        f"wheels unpacked: {', '.join(unpacked) if unpacked else 'none needed'}",
        "",
        plan.table() if plan is not None else "(no memory plan)",
        "",
    ]
    header = (
        f"{'step':>4}{'gen s':>9}{'user s':>9}{'update s':>10}{'step s':>9}{'gen tok/s':>11}"
        f"{'turns':>7}{'peak alloc GiB':>16}{'peak reserved GiB':>19}"
    )
    lines += [header, "-" * len(header)]
    for m in metrics:
        # Three decimals: at the test's tiny shape a step's generation takes 0.05-0.07 s on idle
        # cores, and one decimal printed it as 0.0 (a clean-clone CI run failed on that).
        lines.append(
            f"{m['step']:>4}{m['time/generation']:>9.3f}{m['time/user']:>9.3f}{m['time/update']:>10.3f}"
            f"{m['time/step']:>9.3f}{m['tokens/generated_per_second']:>11.1f}"
            f"{m['episode/turns_mean']:>7.2f}{gib(m.get('memory/peak_allocated_gib')):>16}"
            f"{gib(m.get('memory/peak_reserved_gib')):>19}"
        )
    if plan is not None:
        peak = (
            f"{max(m['memory/peak_allocated_gib'] for m in metrics):.2f} GiB"
            if device.type == "cuda"
            else "- (not measured on CPU)"
        )
        lines.append(
            f"\nplan total {plan.total / 2**30:.2f} GiB; measured peak allocated {peak} "
            f"(the plan is an upper bound of the allocator's peak, minus CUDA context and fragmentation)"
        )
    lines.append(f"wall time: {time.perf_counter() - started:.0f} s in all, {built - started:.0f} s to build")
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
