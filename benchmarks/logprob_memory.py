"""Peak memory of the log-prob pass: full-vocabulary logits (before) against the
backbone plus the output head at the trainable positions only, in chunks (after,
:func:`empathy_gym.agents.tokens.forward_tokens`), on CPU with Qwen2.5's vocabulary.

    python benchmarks/logprob_memory.py [--out benchmarks/results/logprob_memory.txt]

Each contender runs in a fresh process; its cost is the peak resident memory (VmHWM)
minus the resident memory just before the pass (model and batch already built). "before"
is what the trainer did until issue 12: ``model(...).logits`` (a float32 (B, L, V)
tensor), then log-softmax and gather over every position (``token_logprobs``), with
entropy in every pass. Rows: the no-gradient pass (old log-probs) and the training pass
(forward and backward).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def rss_gib(field: str) -> float:
    """``VmRSS`` or ``VmHWM`` of this process, GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError(f"no {field} in /proc/self/status")


def contender(method: str, grad: bool, args: argparse.Namespace) -> dict:
    """Build the model and batch, then run one pass and report its memory and time."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from empathy_gym.agents.tokens import TokenData, collate, forward_tokens, token_logprobs

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    config = Qwen2Config(
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=args.vocab,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    model = Qwen2ForCausalLM(config)
    data = []
    for _ in range(args.batch):
        ids = torch.randint(0, args.vocab, (args.length,))
        mask = torch.zeros(args.length - 1, dtype=torch.bool)
        mask[args.length - 1 - args.trainable :] = True  # the last replies are trained
        data.append(TokenData(ids, mask, torch.zeros(args.trainable), torch.zeros(args.trainable, dtype=torch.long)))
    device = torch.device("cpu")
    before = rss_gib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = time.perf_counter()
    with torch.set_grad_enabled(grad):
        if method == "before":
            ids, attention, targets = collate(data, 0, device)
            logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits
            logprobs, entropy = token_logprobs(logits, ids, targets, 1.0)
        else:
            chunk = int(method.split(":")[1])
            out = forward_tokens(model, data, 0, device, 1.0, entropy=grad, chunk_tokens=chunk)
            logprobs, entropy = out.logprobs, out.entropy
        if grad:
            (logprobs.sum() - 1e-3 * entropy.sum()).backward()
    seconds = time.perf_counter() - start
    return {
        "method": method,
        "grad": grad,
        "peak_gib": rss_gib("VmHWM") - before,
        "seconds": seconds,
        "positions": int(logprobs.numel()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=152064, help="Qwen2.5's vocabulary")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=1024, help="tokens per dialogue")
    parser.add_argument("--trainable", type=int, default=384, help="trainable positions per dialogue")
    parser.add_argument("--chunks", default="1024,256", help="policy.logprob_chunk_tokens values to compare")
    parser.add_argument("--out")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # method,grad: run one contender
    args = parser.parse_args()
    if args.one:
        method, grad = args.one.split(",")
        print(json.dumps(contender(method, grad == "1", args)))
        return
    from _machine import cpu_model

    rows = []
    methods = ["before", *(f"after:{c}" for c in args.chunks.split(","))]
    for grad in (False, True):
        for method in methods:
            command = [sys.executable, __file__, *sys.argv[1:], "--one", f"{method},{int(grad)}"]
            command = [c for i, c in enumerate(command) if c != "--out" and (i == 0 or command[i - 1] != "--out")]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    full = args.batch * args.length * args.vocab * 4 / 2**30
    lines = [
        f"log-prob pass, CPU: 2-layer Qwen2 (hidden {args.hidden}), vocabulary {args.vocab}, "
        f"{args.batch} dialogues x {args.length} tokens, {args.trainable} trainable positions each",
        f"one float32 (B, L, V) logits tensor: {full:.2f} GiB",
        f"{cpu_model()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        "",
        f"{'pass':<26}{'contender':<30}{'peak GiB':>10}{'x less':>8}{'seconds':>9}",
    ]
    for grad in (False, True):
        label = "training (fwd + bwd)" if grad else "old log-probs (no grad)"
        mine = [r for r in rows if r["grad"] == grad]
        for row in mine:
            name = (
                "before: full logits"
                if row["method"] == "before"
                else f"after: chunks of {row['method'].split(':')[1]} positions"
            )
            lines.append(
                f"{label:<26}{name:<30}{row['peak_gib']:>10.2f}"
                f"{mine[0]['peak_gib'] / max(row['peak_gib'], 1e-9):>8.1f}{row['seconds']:>9.2f}"
            )
    lines.append(
        "\npeak = the pass's peak resident memory above the resident memory before it (VmHWM - VmRSS), "
        "each contender in a fresh process"
    )
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
