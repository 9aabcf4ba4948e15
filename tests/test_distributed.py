"""Two training processes on CPU (torchrun, gloo): each plays half of a step's dialogues,
gradients are summed (each already divided by the global token count) before every
optimiser step, so both end with the same weights;
the first process writes every episode, the metrics and the checkpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys
from empathy_gym.agents import TRAINERS, load_recipe
algorithm, out = sys.argv[1], sys.argv[2]
extra = ["num_generations=2"] if algorithm == "grpo" else []
config = load_recipe("agents/tiny-cpu.yaml", [f"output_dir={out}", "total_steps=2", "rollout_batch_size=4",
                                              "progress=false", "save_steps=2", "generation.max_new_tokens=4",
                                              "policy.device=cpu", "learning_rate=1e-2", *extra],
                     algorithm=algorithm)
trainer = TRAINERS[algorithm](config)
before = float(sum(p.double().sum() for p in trainer.model.parameters()))
trainer.train()
after = float(sum(p.double().sum() for p in trainer.model.parameters()))
with open(f"{out}.rank{trainer.processes.rank}.txt", "w") as handle:  # stdout lines of processes interleave
    handle.write(f"{trainer.processes.world} {before!r} {after!r}")
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_two_processes_keep_the_same_weights_and_write_every_episode_once(tmp_path, algorithm):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    # an empty model cache: both processes need the tiny model, the first one builds it
    fresh_cache = {**os.environ, "EMPATHY_GYM_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), str(script), algorithm, str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=fresh_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = {}
    for path in tmp_path.glob("run.rank*.txt"):
        world, before, after = path.read_text().split()
        ranks[int(path.name[len("run.rank"):-len(".txt")])] = (int(world), float(before), float(after))
    assert sorted(ranks) == [0, 1] and ranks[0][0] == ranks[1][0] == 2
    assert ranks[0][2] == ranks[1][2] != ranks[0][1]   # trained, and identically in both
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert [(e["step"], e["key"]) for e in episodes] == [(s, k) for s in (1, 2) for k in range(4)]
    # GRPO: whole groups per process (group 0 on rank 0, group 1 on rank 1)
    groups = [e["group"] for e in episodes]
    assert groups == ([0, 0, 1, 1] * 2 if algorithm == "grpo" else [0, 1, 2, 3] * 2)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    if algorithm == "grpo":  # counts are totals over the processes
        assert all(m["grpo/groups"] == 2 for m in metrics)
    assert (out / "checkpoints" / "step-000002" / "policy").is_dir()


def test_each_process_plays_whole_groups():
    from empathy_gym.agents.distributed import Processes
    processes = Processes(cpu=True)
    assert (processes.rank, processes.world) == (0, 1) and processes.mine([0, 0, 1, 1]) == [0, 1, 2, 3]
    processes.rank, processes.world = 1, 2
    assert processes.mine([0, 0, 1, 1, 2, 2, 3, 3]) == [2, 3, 6, 7]


def test_metrics_are_means_over_processes_and_counts_are_totals(monkeypatch):
    from empathy_gym.agents import distributed
    processes = distributed.Processes(cpu=True)
    processes.world = 2
    other = {"loss": float("nan"), "reward": 0.25, "groups": 3.0}  # what the other process has
    # the other process's (values, counts) in sorted key order: groups, loss, reward
    monkeypatch.setattr(processes, "sum", lambda values: [a + b for a, b in zip(
        values, [3.0, 0.0, 0.25, 1.0, 0.0, 1.0])])
    mine = {"loss": float("nan"), "reward": 0.75, "groups": 1.0}
    merged = processes.mean_metrics(mine, summed=["groups"])
    assert merged["reward"] == 0.5 and merged["groups"] == 4.0 and merged["loss"] != merged["loss"]
    assert set(merged) == set(other)


GRADIENTS = """
import sys
import torch
from empathy_gym.agents.distributed import Processes
processes = Processes(cpu=True)
weight = torch.nn.Parameter(torch.zeros(3))
if processes.rank != 1:                    # process 1 had no signal: no gradient
    weight.grad = torch.full((3,), float(processes.rank + 1))
processes.sum_gradients([weight])
with open(f"{sys.argv[1]}/grad{processes.rank}.txt", "w") as handle:
    handle.write(str(weight.grad.tolist()))
"""


def test_gradients_are_summed_over_the_processes(tmp_path):
    """Three processes: gradients 1, none, 3 -> every process steps with 1 + 0 + 3 = 4.
    (Each process's loss is already divided by the mini-batch's token count over all
    processes, so the sum is the gradient of the mini-batch's token mean; a process
    without signal adds nothing and dilutes nothing.)"""
    script = tmp_path / "grad.py"
    script.write_text(GRADIENTS)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3",
                           "--master_port", str(free_port()), str(script), str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    grads = [(tmp_path / f"grad{rank}.txt").read_text() for rank in range(3)]
    assert grads == ["[4.0, 4.0, 4.0]"] * 3
