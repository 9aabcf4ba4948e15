"""Seeds derived from other values, so that nothing depends on global RNG state.

Every random choice of a run (env seeds of a training step, sampling seeds of a turn,
the seed of an evaluation dialogue) is a function of the run's seed and the position
of the choice, never of how many draws came before it. Batching, resuming and
``--limit`` then leave results unchanged.
"""

from __future__ import annotations

import zlib

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
