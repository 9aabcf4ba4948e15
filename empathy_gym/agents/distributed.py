"""Data parallelism: one process per device under ``accelerate launch`` or ``torchrun``
(see docs/training.md, "Several GPUs"). With one process every method is a no-op.

Each loss is already divided by the token count of all processes, so gradients are
*summed*, not averaged as in DDP (Li et al. 2020, "PyTorch Distributed", arXiv
2006.15704, section 3.2), whose per-process division weighs a token of a short shard
more than one of a long shard.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


class Processes:
    """This process's place among the training processes.

    Args:
        cpu: join with gloo on CPUs (else NCCL on the local GPU).

    Attributes:
        rank: 0-based index of this process; ``world``: how many there are.
        device: this process's device under a launcher, else ``None`` (the config decides).
    """

    def __init__(self, cpu: bool):
        self.rank, self.world, self.device = 0, 1, None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import PartialState

            state = PartialState(cpu=cpu)
            self.rank, self.world, self.device = state.process_index, state.num_processes, state.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def mine(self, groups: Iterable[int]) -> list[int]:
        """Indices of the dialogues this process plays: those whose group % world == rank."""
        return [i for i, group in enumerate(groups) if group % self.world == self.rank]

    def sum_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        """Replace each gradient by its sum over the processes (a process with no
        gradient, e.g. GRPO with no signal in its groups, adds zeros)."""
        if self.world == 1:
            return
        for parameter in parameters:
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            dist.all_reduce(parameter.grad)

    def any(self, flag: bool) -> bool:
        """True when ``flag`` is True in any process (e.g. a Ctrl-C seen by one)."""
        if self.world == 1:
            return flag
        value = torch.tensor([float(flag)], device=self._collective_device())
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sums over the processes."""
        if self.world == 1:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(tensor)
        return tensor.tolist()

    def reduce_metrics(self, metrics: dict[str, float], summed: Iterable[str] = ()) -> dict[str, float]:
        """The step's metrics over all processes, as if one process had played every
        dialogue (:func:`pool_metrics` of every process's dict). Every process must pass
        the same keys."""
        if self.world == 1:
            return metrics
        return pool_metrics(self.gather([metrics]), summed)

    def from_main(self, compute: Callable[[], T]) -> T:
        """``compute()`` run in the first process only, its (picklable) result handed to
        every process; an exception it raises is raised in every process."""
        if self.world == 1:
            return compute()
        box: list[Any] = [None]
        if self.is_main:
            try:
                box[0] = (compute(), None)
            except Exception as error:  # noqa: BLE001 (sent to the others, then raised here too)
                box[0] = (None, error)
        dist.broadcast_object_list(box, src=0)
        result, error = box[0]
        if error is not None:
            raise error
        return result

    def gather(self, items: list[Any]) -> list[Any]:
        """All processes' ``items`` concatenated in rank order (picklable objects)."""
        if self.world == 1:
            return list(items)
        from accelerate.utils import gather_object

        return gather_object(items)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def _collective_device(self) -> Any:
        return self.device if self.device is not None and self.device.type == "cuda" else "cpu"


def _is_max(key: str) -> bool:
    return key.endswith("/max") or "/max_" in key


def _is_min(key: str) -> bool:
    return key.endswith("/min") or "/min_" in key


def pool_metrics(parts: list[dict[str, float]], summed: Iterable[str] = ()) -> dict[str, float]:
    """One dict of metrics from the per-process dicts ``parts`` (same keys), exact where
    the parts carry what it takes:

    * ``summed`` keys and counts (``<prefix>/count``): the total;
    * ``.../max``, ``.../max_*``: the largest; ``.../min``, ``.../min_*``: the smallest;
    * the other keys of a prefix with a count (``describe``'s ``mean``, the sampler's
      token means): the count-weighted mean; ``<prefix>/std``: the pooled population
      standard deviation, sqrt(sum n_i (s_i^2 + m_i^2) / N - m^2) with m the pooled mean;
    * anything else: the mean over the parts that have a number (NaN in none).
    """
    summed = set(summed)
    out: dict[str, float] = {}
    for key in parts[0]:
        values = [part[key] for part in parts]
        finite = [v for v in values if not math.isnan(v)]
        prefix = key.rsplit("/", 1)[0]
        counts = [part.get(f"{prefix}/count", float("nan")) for part in parts]
        if key in summed or key.endswith("/count"):
            out[key] = float(sum(finite)) if finite else float("nan")
        elif _is_max(key) or _is_min(key):
            out[key] = (max if _is_max(key) else min)(finite) if finite else float("nan")
        elif f"{prefix}/count" in parts[0] and not any(math.isnan(c) for c in counts):
            out[key] = _pooled(key, prefix, parts, counts)
        else:
            out[key] = sum(finite) / len(finite) if finite else float("nan")
    return out


def _pooled(key: str, prefix: str, parts: list[dict[str, float]], counts: list[float]) -> float:
    total = sum(counts)
    live = [(part, n) for part, n in zip(parts, counts) if n > 0 and not math.isnan(part[key])]
    if not total or not live:
        return float("nan")
    if not key.endswith("/std"):
        return sum(part[key] * n for part, n in live) / sum(n for _, n in live)
    mean = sum(part[f"{prefix}/mean"] * n for part, n in live) / total
    second = sum(n * (part[key] ** 2 + part[f"{prefix}/mean"] ** 2) for part, n in live) / total
    return math.sqrt(max(0.0, second - mean * mean))
