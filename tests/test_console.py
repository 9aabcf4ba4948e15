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
