"""Two training processes on CPU (torchrun, gloo): each plays half of a step's dialogues,
gradients are summed (each already divided by the global token count) before every
optimiser step, so both end with the same weights;
the first process writes every episode, the metrics and the checkpoint."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchrun import torchrun

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
from empathy_gym.agents.callbacks import TrainerCallback
class Counting(TrainerCallback):
    calls = 0
    def on_step_end(self, state, step, trajectories):
        Counting.calls += 1
        return {"test/rank": float(state.rank), "test/trajectories": float(len(trajectories))}
trainer = TRAINERS[algorithm](config, callbacks=[Counting()])
before = float(sum(p.double().sum() for p in trainer.model.parameters()))
trainer.train()
after = float(sum(p.double().sum() for p in trainer.model.parameters()))
with open(f"{out}.rank{trainer.processes.rank}.txt", "w") as handle:  # stdout lines of processes interleave
    handle.write(f"{trainer.processes.world} {before!r} {after!r} {Counting.calls}")
"""


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_two_processes_keep_the_same_weights_and_write_every_episode_once(tmp_path, algorithm):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    # an empty model cache: both processes need the tiny model, the first one builds it
    fresh_cache = {**os.environ, "EMPATHY_GYM_CACHE": str(tmp_path / "cache")}
    done = torchrun(script, 2, algorithm, out, env=fresh_cache)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = {}
    for path in tmp_path.glob("run.rank*.txt"):
        world, before, after, calls = path.read_text().split()
        ranks[int(path.name[len("run.rank") : -len(".txt")])] = (int(world), float(before), float(after), int(calls))
    assert sorted(ranks) == [0, 1] and ranks[0][0] == ranks[1][0] == 2
    assert ranks[0][2] == ranks[1][2] != ranks[0][1]  # trained, and identically in both
    assert (ranks[0][3], ranks[1][3]) == (2, 0)  # step callbacks run once per step, in the first process
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert [(e["step"], e["key"]) for e in episodes] == [(s, k) for s in (1, 2) for k in range(4)]
    # GRPO: whole groups per process (group 0 on rank 0, group 1 on rank 1)
    groups = [e["group"] for e in episodes]
    assert groups == ([0, 0, 1, 1] * 2 if algorithm == "grpo" else [0, 1, 2, 3] * 2)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # the callback saw both processes' dialogues, and its metrics are the first process's
    assert all(m["test/rank"] == 0 and m["test/trajectories"] == 4 for m in metrics)
    if algorithm == "grpo":  # counts are totals over the processes
        assert all(m["grpo/groups"] == 2 for m in metrics)
    assert (out / "checkpoints" / "step-000002" / "policy").is_dir()


def test_each_process_plays_whole_groups():
    from empathy_gym.agents.distributed import Processes

    processes = Processes(cpu=True)
    assert (processes.rank, processes.world) == (0, 1) and processes.mine([0, 0, 1, 1]) == [0, 1, 2, 3]
    processes.rank, processes.world = 1, 2
    assert processes.mine([0, 0, 1, 1, 2, 2, 3, 3]) == [2, 3, 6, 7]


def test_pooled_metrics_are_those_of_all_the_tokens():
    """Two processes, values [1, 2, 3] and [5, 7]: max 7 (the mean of the maxima said 5),
    min 1, mean 18 / 5 = 3.6, population std sqrt(88 / 5 - 3.6^2) = sqrt(4.64); token
    means weigh by their counts; counts and summed keys add up; other keys are means."""
    from empathy_gym.agents.distributed import pool_metrics
    from empathy_gym.agents.trainer import describe

    first = describe("advantage", [torch.tensor([1.0, 2.0, 3.0])]) | {
        "sampler/kl": 0.1,
        "sampler/count": 3.0,
        "grpo/groups": 1.0,
        "reward": 0.25,
    }
    second = describe("advantage", [torch.tensor([5.0, 7.0])]) | {
        "sampler/kl": 0.6,
        "sampler/count": 2.0,
        "grpo/groups": 2.0,
        "reward": float("nan"),
    }
    pooled = pool_metrics([first, second], summed=["grpo/groups"])
    everything = describe("advantage", [torch.tensor([1.0, 2.0, 3.0, 5.0, 7.0])])
    assert pooled["advantage/max"] == 7.0 and pooled["advantage/min"] == 1.0
    assert pooled["advantage/mean"] == pytest.approx(3.6) and pooled["advantage/count"] == 5.0
    assert pooled["advantage/std"] == pytest.approx(math.sqrt(4.64)) == pytest.approx(everything["advantage/std"])
    assert pooled["sampler/kl"] == pytest.approx((0.1 * 3 + 0.6 * 2) / 5)
    assert pooled["grpo/groups"] == 3.0 and pooled["reward"] == 0.25


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
    done = torchrun(script, 3, tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    grads = [(tmp_path / f"grad{rank}.txt").read_text() for rank in range(3)]
    assert grads == ["[4.0, 4.0, 4.0]"] * 3


STEP = """
import sys
from empathy_gym.agents import TRAINERS, load_recipe
out = sys.argv[1]
config = load_recipe("agents/tiny-cpu.yaml", [f"output_dir={out}", "total_steps=1", "rollout_batch_size=8",
                                              "num_generations=2", "progress=false", "save_steps=0",
                                              "generation.max_new_tokens=6", "policy.device=cpu", "report_to=none"],
                     algorithm="grpo")
TRAINERS["grpo"](config).train()
"""


def test_one_process_and_two_give_the_same_step(tmp_path):
    """The same recipe and seed on one process and on two (torchrun, gloo): the same
    dialogues (each one's sampling seeds come from its index in the step, not from the
    process) and the same metrics, maxima, minima and standard deviations included (they
    were means of the processes' values: -0.18375 against -0.17375 for the mean return)."""
    script = tmp_path / "step.py"
    script.write_text(STEP)
    single = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "one")], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert single.returncode == 0, single.stderr[-3000:]
    double = torchrun(script, 2, tmp_path / "two")
    assert double.returncode == 0, double.stderr[-3000:]

    def read(name, file):
        return [json.loads(line) for line in (tmp_path / name / file).read_text().splitlines()]

    (one,), (two,) = read("one", "metrics.jsonl"), read("two", "metrics.jsonl")
    episodes = [{k: e[k] for k in ("key", "persona_id", "messages", "rewards")} for e in read("one", "episodes.jsonl")]
    assert episodes == [
        {k: e[k] for k in ("key", "persona_id", "messages", "rewards")} for e in read("two", "episodes.jsonl")
    ]
    timing = ("time/", "tokens/generated_per_second")
    keys = [k for k in one if not k.startswith(timing)]
    assert set(keys) == {k for k in two if not k.startswith(timing)}
    assert {"advantage/max", "advantage/std", "sampler/max_ratio"} <= set(keys)
    for key in keys:
        if one[key] is None or two[key] is None:
            assert one[key] == two[key], key
        else:
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key


def test_a_dynamic_sampling_budget_that_does_not_split_over_the_processes_is_refused(monkeypatch):
    from empathy_gym.agents import RecipeError, load_recipe

    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(RecipeError, match=r"dynamic_sampling_budget 2 does not split evenly over 4 processes"):
        load_recipe(
            "agents/tiny-cpu.yaml",
            ["num_generations=2", "rollout_batch_size=8", "dynamic_sampling_budget=2"],
            algorithm="grpo",
        )
