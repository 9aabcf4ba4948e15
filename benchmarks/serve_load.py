"""The OpenEnv server under load, side by side with the same dialogues in-process.

    pip install -e '.[openenv]'   # or run it with the test suite's openenv layer's python
    python benchmarks/serve_load.py [--sessions 1 8 64 256] [--dialogues 256] [--soak-s 120] [--no-write]

1. Throughput and step latency with the rule user: ``--dialogues`` dialogues of three
   turns (fixed replies, seeds 0, 1, ...), ``N`` at a time for each ``--sessions`` N:
   over ``empathy-gym serve`` (one WebSocket session per running dialogue, OpenEnv's
   client) and in-process (the same dialogues through one
   :class:`~empathy_gym.engine.DialogueEngine`, ``N`` coroutines). Step latency is the
   client's, from sending the action to reading the observation; p50 and p99 over every
   step.
2. The batching window's effect with the SmolLM2 transformers user (:data:`LLM_USER`) (``--llm-steps`` turns
   each over 1 and over 8 concurrent sessions, reset first, then started together): turns
   answered (appraised and replied to) per second, and how many user batches held them.
3. Memory: the server's resident set (``/proc/PID/status`` VmRSS) after each of 10 rounds
   of 256 concurrent dialogues: no growth.
4. Soak: ``--soak-s`` seconds of clients that each play a dialogue, a third of them
   vanishing after one turn (the socket closed without a goodbye); at the end every
   session is freed (``/metrics``) and the resident set is compared with the start.

The load stays on 127.0.0.1; the server is stopped by PID. Writes
``benchmarks/results/serve_load.txt`` unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))  # the server launcher of the tests

from _machine import cpu_model, provenance, publish  # noqa: E402
from servers import Server, free_port, start  # noqa: E402

from empathy_gym.engine import DialogueEngine  # noqa: E402
from empathy_gym.integrations.openenv import EmpathyAction, EmpathyEnvClient  # noqa: E402

REPLIES = ["That sounds really hard. What happened?", "I hear you. You are not alone in this.", "Tell me more."]
ENV = {"env_id": "EmpathyDialogue-v0"}
#: SmolLM2 scores the appraisal's options and writes the bare reply (SAGE's planned reply,
#: one JSON object, is more than it writes reliably), at most 64 tokens
LLM_USER = "transformers:smollm2,appraisal_mode=choice,reply_plan=false,max_tokens=64"


def serve(*args: str) -> Server:
    """``empathy-gym serve ARGS`` on a free port of 127.0.0.1, ready (tests/servers.py's
    launcher: stopped by PID, SIGKILL after 15 s if a model user's turn holds SIGTERM)."""
    port = free_port()
    command = [sys.executable, "-m", "empathy_gym.cli", "serve", "--port", str(port), *args]
    log = Path(tempfile.mkdtemp(prefix="serve-load-")) / "serve.log"
    return start(command, f"http://127.0.0.1:{port}", "", log, timeout_s=300)


def rss_mib(server: Server) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metrics(server: Server) -> dict[str, int]:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as response:
        return json.loads(response.read())


async def llm_sessions(url: str, sessions: int, steps: int) -> tuple[int, int, float]:
    """``sessions`` sessions of ``steps`` turns each, started together: every session
    resets first, then all play (a new dialogue when one ends, or when the user failed to
    answer: SmolLM2 does not always write the reply's JSON). ``(answered, failed, seconds
    from the first turn to the last answer)``."""
    clients = [EmpathyEnvClient(base_url=url, message_timeout_s=1200) for _ in range(sessions)]
    try:
        for seed, client in enumerate(clients):  # one at a time: a reset waits for the user anyway
            await client.connect()
            await client.reset(seed=seed)
        start = time.perf_counter()
        counts = await asyncio.gather(*(llm_turns(client, steps, seed) for seed, client in enumerate(clients)))
        seconds = time.perf_counter() - start
    finally:
        for client in clients:
            await client.close()
    return sum(a for a, _ in counts), sum(f for _, f in counts), seconds


async def llm_turns(client: EmpathyEnvClient, steps: int, seed: int) -> tuple[int, int]:
    answered = failed = 0
    for turn in range(steps):
        try:
            result = await client.step(EmpathyAction(utterance=REPLIES[turn % len(REPLIES)]))
        except RuntimeError as error:
            if "the simulated user failed" not in str(error):
                raise
            failed += 1
            await client.reset(seed=seed + 1000 * (turn + 1))
            continue
        answered += 1
        if result.done:
            await client.reset(seed=seed + 1000 * (turn + 1))
    return answered, failed


async def played_remotely(url: str, seed: int, latencies: list[float], vanish: bool = False) -> list[int]:
    client = EmpathyEnvClient(base_url=url, message_timeout_s=600)
    await client.connect()
    try:
        result = await client.reset(seed=seed)
        emotions = [result.observation.emotion]
        for reply in REPLIES:
            start = time.perf_counter()
            result = await client.step(EmpathyAction(utterance=reply))
            latencies.append(time.perf_counter() - start)
            emotions.append(result.observation.emotion)
            if vanish:
                await client._ws.close()  # no goodbye: the server must notice
                client._ws = None
                return emotions
            if result.done:
                break
        return emotions
    finally:
        if client._ws is not None:
            await client.close()


async def played_in_process(engine: DialogueEngine, seed: int, latencies: list[float]) -> list[int]:
    env = engine.new_env()
    _, info = await engine.reset(env, seed)
    emotions = [info["emotion"]]
    for reply in REPLIES:
        start = time.perf_counter()
        _, _, terminated, truncated, info = await engine.submit(env, reply)
        latencies.append(time.perf_counter() - start)
        emotions.append(info["emotion"])
        if terminated or truncated:
            break
    return emotions


async def at_most(concurrency: int, jobs: list) -> list:
    gate = asyncio.Semaphore(concurrency)

    async def run(job):
        async with gate:
            return await job()

    return await asyncio.gather(*(run(job) for job in jobs))


def timed(sessions: int, dialogues: int, play_one) -> dict[str, Any]:
    """``play_one(seed, latencies)`` for seeds 0..dialogues-1, ``sessions`` at a time."""
    latencies: list[float] = []
    jobs = [functools.partial(play_one, seed, latencies) for seed in range(dialogues)]
    start = time.perf_counter()
    played = asyncio.run(at_most(sessions, jobs))
    seconds = time.perf_counter() - start
    return {
        "dialogues_per_s": dialogues / seconds,
        "p50_ms": 1000 * float(np.percentile(latencies, 50)),
        "p99_ms": 1000 * float(np.percentile(latencies, 99)),
        "played": played,
    }


def throughput(url: str, sessions: int, dialogues: int) -> tuple[dict[str, Any], dict[str, Any]]:
    engine = DialogueEngine(ENV)
    rows = {
        "server": timed(sessions, dialogues, functools.partial(played_remotely, url)),
        "in-process": timed(sessions, dialogues, functools.partial(played_in_process, engine)),
    }
    engine.close()
    assert rows["server"]["played"] == rows["in-process"]["played"], "the server played other dialogues"
    return rows["server"], rows["in-process"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--dialogues", type=int, default=256)
    parser.add_argument("--llm-steps", type=int, default=8)
    parser.add_argument("--soak-s", type=float, default=120.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    # SIGTERM (timeout, a scheduler) unwinds like Ctrl-C, so the servers' `finally` stops them
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    started = time.time()
    lines = [
        "# The OpenEnv server under load, beside the same dialogues in-process (benchmarks/serve_load.py)",
        provenance(no_inputs="a timing of the server; the dialogues are checked equal in-process"),
        f"# machine: {cpu_model()}; load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        f"# {args.dialogues} dialogues of up to {len(REPLIES)} turns, rule user, fixed replies; "
        "client-side step latency",
        "",
        f"{'sessions':>8s}  {'where':10s} {'dialogues/s':>11s} {'p50 ms':>8s} {'p99 ms':>8s}",
    ]
    # room for the sessions a finished round's clients have closed and the server not yet freed
    room = 2 * max(256, *args.sessions)
    server = serve("--env", ENV["env_id"], "--max-sessions", str(room), "--idle-timeout-s", "5")
    try:
        for sessions in args.sessions:
            remote, local = throughput(server.url, sessions, args.dialogues)
            for where, row in (("server", remote), ("in-process", local)):
                rate, p50, p99 = row["dialogues_per_s"], row["p50_ms"], row["p99_ms"]
                lines.append(f"{sessions:8d}  {where:10s} {rate:11.1f} {p50:8.1f} {p99:8.1f}")
        lines += ["", "the same dialogues over the server and in-process: equal emotions, turn for turn (checked)", ""]
        rss = []
        for _ in range(10):
            asyncio.run(at_most(256, [functools.partial(played_remotely, server.url, s, []) for s in range(256)]))
            rss.append(rss_mib(server))
        lines.append(
            "server resident set after each of 10 rounds of 256 dialogues (MiB): " + " ".join(f"{x:.0f}" for x in rss)
        )
        before, deadline, rounds, rng = rss_mib(server), time.monotonic() + args.soak_s, 0, random.Random(0)
        while time.monotonic() < deadline:
            jobs = [
                lambda s=s: played_remotely(server.url, s, [], vanish=rng.random() < 1 / 3)
                for s in range(rounds * 64, rounds * 64 + 64)
            ]
            asyncio.run(at_most(64, jobs))
            rounds += 1
        time.sleep(12)  # a vanished session is freed when the server notices the closed socket
        counts = metrics(server)
        lines.append(
            f"soak: {args.soak_s:.0f} s, {rounds * 64} dialogues (a third vanished after one turn); "
            f"sessions still open after: {counts['sessions_active']}; "
            f"resident set {before:.0f} -> {rss_mib(server):.0f} MiB"
        )
    finally:
        server.stop()
    lines += ["", f"the SmolLM2 transformers user, {LLM_USER} ({args.llm_steps} turns per session):"]
    llm = serve("--env", ENV["env_id"], "--user", LLM_USER, "--max-sessions", "16")
    try:
        steps = max(1, args.llm_steps)
        for sessions in (1, 8):
            before = metrics(llm)
            answered, failed, seconds = asyncio.run(llm_sessions(llm.url, sessions, steps))
            after = metrics(llm)
            batches = after["user_batches"] - before["user_batches"]
            turns = after["turns_batched"] - before["turns_batched"]
            lines.append(
                f"  {sessions} session(s): {answered / seconds:.2f} turns answered/s ({answered} answered, "
                f"{failed} the user failed to answer, {seconds:.0f} s; {turns} turns in {batches} user batches)"
            )
    finally:
        llm.stop()
    lines.append(f"took {time.time() - started:.0f} s")
    publish(lines, "serve_load.txt", write=not args.no_write)


if __name__ == "__main__":
    main()
