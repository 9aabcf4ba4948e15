"""Noticing cores that other work is using. On a CPU, torch starts one thread per core;
when other jobs keep those cores busy, the threads wait on each other and a training step
or an evaluation can take several times as long (issue 37: a quick start's steps went
from 9-16 s to 97-250 s beside other work). Nothing here changes the thread count (that
would change a run's floating-point results with the machine's load): it says once what
to set.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

#: A step this many times slower than the first steps' median is worth a word.
SLOW_STEP_FACTOR = 3.0
#: Steps whose median is the reference (the first step, which builds things, left out).
REFERENCE_STEPS = 3
ADVICE = "export OMP_NUM_THREADS=1 (or the cores left free) before the command"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def others_running(samples: int = 5, interval: float = 0.02) -> float:
    """How many other threads are running or waiting for a core now: the median over
    ``samples`` reads of ``/proc/loadavg``'s runnable count, less this reading thread
    (Linux); elsewhere the 1-minute load average (which also counts this process's recent
    work)."""
    path = Path("/proc/loadavg")
    if not path.exists():
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    counts = []
    for index in range(samples):
        if index:
            time.sleep(interval)
        counts.append(int(path.read_text().split()[3].split("/")[0]) - 1)
    return float(sorted(counts)[len(counts) // 2])


def busy_cores_warning(
    threads: int, *, cores: int | None = None, others: float | None = None, env: Mapping[str, str] | None = None
) -> str | None:
    """What to say when other work already uses the cores that ``threads`` torch threads
    will need, or ``None``: when ``OMP_NUM_THREADS`` is set (the user chose), or when the
    other running threads plus ``threads`` fit the ``cores``.

    Args:
        threads: torch's intra-op threads (``torch.get_num_threads()``).
        cores, others, env: default :func:`usable_cores`, :func:`others_running`, ``os.environ``.
    """
    env = os.environ if env is None else env
    if env.get("OMP_NUM_THREADS"):
        return None
    cores = usable_cores() if cores is None else cores
    others = others_running() if others is None else others
    if others + threads <= cores:
        return None
    return (
        f"other work is using the cores ({others:g} other thread{'s' if others != 1 else ''} running on the "
        f"{cores} this process may use) "
        f"and torch runs {threads} threads beside it: they slow each other down, often several times over; {ADVICE}"
    )


class SlowStepWatch:
    """Watches step times and says once when a step is :data:`SLOW_STEP_FACTOR` times the
    median of steps 2 to 1 + :data:`REFERENCE_STEPS` (the first step builds things), with
    ``OMP_NUM_THREADS`` unset."""

    def __init__(self, env: Mapping[str, str] | None = None):
        self.env = os.environ if env is None else env
        self.times: list[float] = []
        self.said = False

    def add(self, seconds: float, step: int | None = None) -> str | None:
        """Record a step's wall time (seconds; ``step``: its number, for the message, default
        the count of steps recorded); returns the warning, the first time only."""
        self.times.append(seconds)
        reference = sorted(self.times[1 : 1 + REFERENCE_STEPS])
        if self.said or self.env.get("OMP_NUM_THREADS") or len(reference) < REFERENCE_STEPS:
            return None
        median = reference[len(reference) // 2]
        if seconds < SLOW_STEP_FACTOR * median:
            return None
        self.said = True
        return (
            f"step {step or len(self.times)} took {seconds:.0f} s, {seconds / median:.1f} times the first steps' "
            f"{median:.0f} s: other work may be using the cores; {ADVICE}"
        )
