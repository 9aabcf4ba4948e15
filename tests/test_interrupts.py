"""The first Ctrl-C or SIGTERM asks a run to stop after its phase; the second aborts;
the handlers it replaced come back (empathy_gym/agents/interrupts.py)."""

from __future__ import annotations

import os
import signal

import pytest

from empathy_gym.agents.interrupts import StopRequest


def test_first_signal_requests_a_stop_the_second_aborts_and_handlers_come_back(caplog):
    before = {signum: signal.getsignal(signum) for signum in StopRequest.SIGNALS}
    request = StopRequest()
    request.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert request.requested
        assert "SIGTERM: finishing the current phase, then saving" in caplog.text
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        request.restore()
    assert {signum: signal.getsignal(signum) for signum in StopRequest.SIGNALS} == before
