"""Seeds derived from other values, so that nothing depends on global RNG state.

Every random choice of a run (env seeds of a training step, sampling seeds of a turn,
the seed of an evaluation dialogue) is a function of the run's seed and the position
of the choice, never of how many draws came before it. Batching, resuming and
``--limit`` then leave results unchanged.
"""

from __future__ import annotations

import contextlib
import random
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np


def derive_seed(*parts: int | str) -> int:
    """A 31-bit seed (int in [0, 2**31 - 1]) from integers and strings, through NumPy's
    ``SeedSequence`` (integers enter as their absolute value, strings as their CRC-32).

    Example:
        >>> derive_seed(0, "persona-7", 1) == derive_seed(0, "persona-7", 1)
        True
    """
    entropy = [zlib.crc32(p.encode("utf-8")) if isinstance(p, str) else abs(int(p)) for p in parts]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] & 0x7FFFFFFF)


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU, and CUDA when present) global RNG states."""
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def rng_kept() -> Iterator[None]:
    """Run code that seeds the global RNGs (a library that calls ``torch.manual_seed``)
    and restore them after it, so that the surrounding run draws what it would have."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)
