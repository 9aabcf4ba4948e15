"""Console output that may not outlive the run.

``python examples/train_ppo.py ... 2>&1 | tee log``, then Ctrl-C: the terminal sends
SIGINT to the whole pipeline, ``tee`` dies first, and every later write of the trainer
to the pipe raises ``BrokenPipeError`` (Python ignores SIGPIPE, so the write fails
instead of killing the process). Progress bars (ours, and those transformers and
huggingface_hub draw while saving a checkpoint) write there; a failure must never
reach the training loop or the checkpoint. :class:`ConsoleStream` swallows it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any


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
def tolerant_console() -> Iterator[None]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` drop output once they fail."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = tolerant(sys.stdout), tolerant(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
