"""Loss aggregation does not depend on how a mini-batch is cut: the gradient of one
mini-batch of dialogues of mixed length is the same with 1, 4 or 16 micro-batches
(``gradient_accumulation_steps``), and with the dialogues shared out over two processes.

A per-micro-batch token mean averaged over micro-batches (the old code) weighs a token
of a short dialogue more than one of a long dialogue once a micro-batch holds a single
dialogue: it is then the sequence mean, and the gradients' directions differ (cosine
about 0.9 here). The trainers now divide every micro-batch's summed loss by the token
count of the whole mini-batch, summed over the processes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torchrun import torchrun

from empathy_gym.agents import TRAINERS, load_recipe
from empathy_gym.agents.rollout import Trajectory

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = [
    "rollout_batch_size=16",
    "num_mini_batches=1",
    "num_ppo_epochs=1",
    "progress=false",
    "report_to=none",
    "save_steps=0",
    "entropy_coef=0.01",
    "generation.max_new_tokens=4",
]


class Captured(Exception):
    """Raised by the patched optimiser step, carrying the mini-batch's gradient."""

    def __init__(self, gradient: torch.Tensor):
        super().__init__("captured")
        self.gradient = gradient


def mixed_length_dialogues(indices, vocab: int, seed: int = 0) -> list[Trajectory]:
    """Dialogues ``indices`` of a fixed set of 16: 1 to 3 agent turns of 1 to 60 tokens
    each, rewards per turn, four groups of four (GRPO), every group with reward spread."""
    g = torch.Generator().manual_seed(seed)
    everything = []
    for key in range(16):
        t = Trajectory(
            key=key,
            group=key // 4,
            env_seed=key // 4,
            persona_id=f"p{key}",
            language="en",
            hidden_intention="deep_empathy",
            character_type="passive",
            emotions=[40],
        )
        t.extend(torch.randint(5, vocab, (12,), generator=g).tolist(), trainable=False)
        turns = 1 + key % 3
        for turn in range(turns):
            length = [1, 60, 7, 33, 2, 45, 15, 3][(key + turn) % 8]
            t.extend(torch.randint(5, vocab, (length,), generator=g).tolist(), trainable=True, logprobs=[-1.0] * length)
            t.turn_ends.append(len(t.token_ids) - 1)
            t.rewards.append(((key * 7 + turn * 3) % 11 - 5) / 100)
            t.emotions.append(t.emotions[-1] + round(t.rewards[-1] * 100))
            if turn < turns - 1:
                t.extend(torch.randint(5, vocab, (9,), generator=g).tolist(), trainable=False)
        t.termination = "max_turns"
        everything.append(t)
    return [everything[i] for i in indices]


def first_minibatch_gradient(trainer, trajectories) -> torch.Tensor:
    """The summed gradient the first optimiser step of ``update`` would use."""
    parameters = [p for group in trainer.optimizer.param_groups for p in group["params"]]

    def capture(*args, **kwargs):
        reduce = getattr(trainer.processes, "sum_gradients", None)
        if reduce is not None:
            reduce(parameters)
        raise Captured(
            torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten().double() for p in parameters])
        )

    trainer.clip_and_step = capture
    try:
        trainer.update(trajectories, step=1)
    except Captured as captured:
        return captured.gradient
    raise AssertionError("update took no optimiser step")


def trainer_for(algorithm: str, tmp_path: Path, accumulation: int, extra=()):
    extra = list(extra) + (["num_generations=4"] if algorithm == "grpo" else [])
    config = load_recipe(
        "agents/tiny-cpu.yaml",
        OVERRIDES + [f"output_dir={tmp_path}", f"gradient_accumulation_steps={accumulation}", *extra],
        algorithm=algorithm,
    )
    return TRAINERS[algorithm](config, envs=[object()] * 16)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize("algorithm,extra", [("ppo", ()), ("grpo", ()), ("grpo", ("loss_type=sequence_mean",))])
def test_the_gradient_does_not_depend_on_gradient_accumulation(tmp_path, algorithm, extra):
    gradients = {}
    for accumulation in (1, 4, 16):
        trainer = trainer_for(algorithm, tmp_path / str(accumulation), accumulation, extra)
        dialogues = mixed_length_dialogues(range(16), trainer.model.config.vocab_size)
        gradients[accumulation] = first_minibatch_gradient(trainer, dialogues)
    assert float(gradients[1].norm()) > 0
    for accumulation in (4, 16):
        assert cosine(gradients[1], gradients[accumulation]) > 0.9999
        assert float(gradients[accumulation].norm() / gradients[1].norm()) == pytest.approx(1.0, abs=1e-3)


SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import test_loss_aggregation as t
out = t.Path(sys.argv[1])
results = {{}}
for algorithm in ("ppo", "grpo"):
    for accumulation in (1, 4):
        trainer = t.trainer_for(algorithm, out / algorithm / str(accumulation), accumulation)
        rank = trainer.processes.rank
        # GRPO: whole groups per process (group % 2 == rank); PPO: every other dialogue
        mine = [i for i in range(16) if ((i // 4) if algorithm == "grpo" else i) % 2 == rank]
        dialogues = t.mixed_length_dialogues(mine, trainer.model.config.vocab_size)
        results[f"{{algorithm}} {{accumulation}}"] = t.first_minibatch_gradient(trainer, dialogues).tolist()
if rank == 0:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "gradients.json", "w") as handle:
        json.dump(results, handle)
"""


def test_two_processes_give_the_gradient_of_one(tmp_path):
    """Two processes (torchrun, gloo), each with half of the dialogues (of other lengths
    than the other half's), with 1 and 4 micro-batches: the summed gradient equals the
    single process's, for PPO and GRPO."""
    expected = {}
    for algorithm in ("ppo", "grpo"):
        single = trainer_for(algorithm, tmp_path / "single", 1)
        expected[algorithm] = first_minibatch_gradient(
            single, mixed_length_dialogues(range(16), single.model.config.vocab_size)
        )
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(tests=str(REPO / "tests")))
    environment = {**os.environ, "PYTHONPATH": str(REPO)}
    done = torchrun(script, 2, tmp_path / "two", env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "two" / "gradients.json").read_text())
    for key, gradient in results.items():
        gradient = torch.tensor(gradient, dtype=torch.float64)
        reference = expected[key.split()[0]]
        assert cosine(reference, gradient) > 0.9999, key
        assert float(gradient.norm() / reference.norm()) == pytest.approx(1.0, abs=1e-3), key
