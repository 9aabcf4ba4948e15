"""Stopping a run cleanly: the first Ctrl-C (or the SIGTERM a scheduler such as Slurm or
Kubernetes sends before it kills) asks the run to finish its current phase, save and stop;
a second one aborts at once."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

log = logging.getLogger(__name__)


class StopRequest:
    """SIGINT and SIGTERM handlers that set :attr:`requested`; a second signal raises
    ``KeyboardInterrupt``.

    Attributes:
        requested: True once a first signal came (or a caller set it).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        log.warning("%s: finishing the current phase, then saving; send it again to abort", name)

    def install(self) -> None:
        """Install the handlers, remembering the ones they replace (none off the main
        thread, where Python cannot install any)."""
        if threading.current_thread() is not threading.main_thread():
            return
        previous = {signum: signal.getsignal(signum) for signum in self.SIGNALS}
        for signum in previous:
            signal.signal(signum, self._handle)
        self._previous = {signum: old for signum, old in previous.items() if old is not None}

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}
