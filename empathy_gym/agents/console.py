"""Console output that may not outlive the run.

``... 2>&1 | tee log``, then Ctrl-C: ``tee`` dies first, and every later write to the pipe
raises ``BrokenPipeError`` (Python ignores SIGPIPE). Progress bars (ours, and those
transformers and huggingface_hub draw while saving a checkpoint) write there, and such a
failure must never reach the training loop or the checkpoint: :class:`ConsoleStream`
swallows it. :func:`honour_interrupts` makes Ctrl-C and SIGTERM stop a command in every phase.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

#: The progress bar's fields after each step: name -> (metric, format spec).
PROGRESS_FIELDS: dict[str, tuple[str, str]] = {
    "reward": ("reward/mean_return", "+.3f"),
    "emotion": ("emotion/final_mean", ".1f"),
    "kl": ("policy/approx_kl", ".1e"),
    "clip": ("policy/clipfrac", ".3f"),
}

#: Shown for a metric that is missing or NaN (a step without a policy update, e.g. a
#: GRPO step whose groups were all skipped, has no KL and no clip fraction).
NO_VALUE = "-"


def format_metric(value: Any, spec: str) -> str:
    """``value`` formatted with ``spec``, or :data:`NO_VALUE` when it is ``None``, not a
    number, or NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return NO_VALUE
    return format(value, spec)


def progress_postfix(metrics: Mapping[str, Any]) -> dict[str, str]:
    """The progress bar's postfix for one step's metrics (:data:`PROGRESS_FIELDS`), e.g.
    ``{"reward": "+0.125", "emotion": "52.0", "kl": "-", "clip": "-"}``."""
    return {name: format_metric(metrics.get(key), spec) for name, (key, spec) in PROGRESS_FIELDS.items()}


class ConsoleStream:
    """A text stream that survives the death of the stream under it: once a write or a
    flush fails (``OSError``, e.g. ``BrokenPipeError``; ``ValueError`` of a closed
    file), it drops all further output instead of raising. Every other attribute is
    the wrapped stream's."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self.stream.write(text)
            except (OSError, ValueError):
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                self.broken = True

    def isatty(self) -> bool:
        try:
            return not self.broken and self.stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def tolerant(stream: Any) -> Any:
    """``stream`` wrapped in a :class:`ConsoleStream` (once)."""
    return stream if isinstance(stream, ConsoleStream) or stream is None else ConsoleStream(stream)


@contextlib.contextmanager
def tolerant_console() -> Iterator[tuple[ConsoleStream, ConsoleStream]]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` drop output once they fail; after
    it, a stream that failed is pointed at /dev/null (:func:`point_at_devnull`), so that
    nothing written later (a warning during shutdown, Python's own flush at exit) turns
    the exit status into 120. Yields the two wrappers (``.broken``: the stream failed)."""
    saved = sys.stdout, sys.stderr
    wrapped = sys.stdout, sys.stderr = tolerant(sys.stdout), tolerant(sys.stderr)
    try:
        yield wrapped
    finally:
        sys.stdout, sys.stderr = saved
        for wrapper, stream in zip(wrapped, saved):
            if getattr(wrapper, "broken", False):  # dead: late writers (warnings at shutdown) too
                point_at_devnull(stream)
            else:
                settle(stream)


def settle(stream: Any) -> None:
    """Flush ``stream``; when that fails (the console is gone, with output still in its
    buffer), point its file descriptor at /dev/null, so that Python's own flush at exit
    does not fail too and turn the exit status into 120 (the recipe of Python's
    ``signal`` documentation, "Note on SIGPIPE")."""
    try:
        stream.flush()
    except (OSError, ValueError, AttributeError):
        point_at_devnull(stream)


def point_at_devnull(stream: Any) -> None:
    """Send what is still written to ``stream`` (its file descriptor) to /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def honour_interrupts() -> None:
    """Let Ctrl-C (SIGINT) and SIGTERM stop the command in every phase, saving what is finished.

    A background job of a non-interactive shell (``cmd &`` in a script) inherits SIGINT as
    ignored; SIGTERM (what Slurm sends before it kills) kills Python at once. The trainer's
    handler honours both, but only in training, not in loading or the held-out evaluations.
    Called first by both command lines; a no-op off the main thread.
    """
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.default_int_handler)
