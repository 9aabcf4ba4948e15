"""The training progress bar's fields (:func:`empathy_gym.agents.console.progress_postfix`)."""

import math

import pytest

from empathy_gym.agents.console import format_metric, progress_postfix

STEP = {
    "reward/mean_return": 0.125,
    "emotion/final_mean": 52.04,
    "policy/approx_kl": 0.00123,
    "policy/clipfrac": 0.03125,
}


def test_a_step_with_an_update_shows_every_field():
    assert progress_postfix(STEP) == {"reward": "+0.125", "emotion": "52.0", "kl": "1.2e-03", "clip": "0.031"}


def test_a_step_without_an_update_shows_a_dash_not_nan():
    """A GRPO step whose groups were all skipped reports NaN for KL and clip fraction."""
    skipped = {**STEP, "policy/approx_kl": float("nan"), "policy/clipfrac": math.nan}
    assert progress_postfix(skipped) == {"reward": "+0.125", "emotion": "52.0", "kl": "-", "clip": "-"}


def test_missing_metrics_show_a_dash():
    assert progress_postfix({"reward/mean_return": -1.0}) == {
        "reward": "-1.000",
        "emotion": "-",
        "kl": "-",
        "clip": "-",
    }


@pytest.mark.parametrize(
    ("value", "shown"), [(None, "-"), ("0.5", "-"), (True, "-"), (float("nan"), "-"), (0, "0.000"), (0.5, "0.500")]
)
def test_format_metric(value, shown):
    assert format_metric(value, ".3f") == shown


def test_a_console_gone_stays_quiet_after_the_block():
    """``| tee`` killed by the Ctrl-C: the trainer's writes fail inside the block (its
    streams drop them); after it, the dead stream's file descriptor is /dev/null, so a late
    write (a warning at shutdown) and Python's flush at exit find nothing to fail on and
    the exit status stays 130. (CI once saw 120 here, under load; not reproduced since.)"""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import os, sys, time
        from empathy_gym.agents.console import tolerant_console
        with tolerant_console():
            time.sleep(1.0)                              # the parent closes its end meanwhile
            print("the table after training", flush=True)   # fails: the stream is marked broken
            sys.stderr.write("stopped at step 3\\n")
        sys.stdout.write("a late line, after the block\\n")  # block-buffered: flushed at exit
        os.write(sys.stdout.fileno(), b"")               # the descriptor is still open
        sys.exit(130)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    child.stdout.close()
    assert child.wait(timeout=60) == 130
