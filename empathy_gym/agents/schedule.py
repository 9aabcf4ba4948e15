"""Learning-rate schedules: a linear warm-up, then constant (verl's default) or cosine.

As verl (``verl/workers/fsdp_workers.py``: transformers' ``get_constant_schedule_with_warmup``
and ``get_cosine_schedule_with_warmup``, ``num_warmup_steps = int(lr_warmup_steps_ratio *
total_training_steps)``), the schedule steps once per training step, after its updates,
so the warm-up counts training steps; with a warm-up the first step runs at a multiplier of 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

SCHEDULES = ("constant", "cosine")


def multiplier(kind: str, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> Callable[[int], float]:
    """The factor on the base learning rate at each training step (0-based).

    ``"constant"``: ``step / warmup_steps`` during the warm-up, then 1
    (``get_constant_schedule_with_warmup``). ``"cosine"``: the same warm-up, then
    ``min_ratio + (1 - min_ratio) * (1 + cos(pi * progress)) / 2`` with ``progress`` from 0
    to 1 over the remaining steps (``get_cosine_schedule_with_warmup`` with verl's
    ``min_lr_ratio``).

    Raises:
        ValueError: an unknown ``kind``.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {list(SCHEDULES)}, got {kind!r}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return step / max(1, warmup_steps)
        if kind == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def make_scheduler(
    optimizer: torch.optim.Optimizer,
    warmup_ratios: Sequence[float],
    total_steps: int,
    kind: str = "constant",
    min_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """One :func:`multiplier` per parameter group of ``optimizer`` (in order), each with
    ``int(ratio * total_steps)`` warm-up steps.

    Raises:
        ValueError: as :func:`multiplier`, or not one ratio per group.
    """
    if len(warmup_ratios) != len(optimizer.param_groups):
        raise ValueError(f"{len(warmup_ratios)} warm-up ratios for {len(optimizer.param_groups)} parameter groups")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, [multiplier(kind, int(ratio * total_steps), total_steps, min_ratio) for ratio in warmup_ratios]
    )
