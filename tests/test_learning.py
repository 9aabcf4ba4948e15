"""The tiny recipe learns against the rule-based user, with PPO and with GRPO, and more
than a run that cannot learn.

The control: the same run (same seeds, personas, opening lines and sampling seeds)
with each step's rewards shuffled across the step's dialogues before the update, so
the update sees rewards of the same size and spread that do not belong to the replies
they are paid for. Whatever a run gains without learning (entropy collapse, drift of a
tiny random model towards some output that happens to score better) the control gains
too. (Before this control, PPO passed the old test with shuffled rewards: gain +0.019,
t 5.98, from a collapse onto Latin output.)

The claim tested: the real run's gain (mean episode return of the last 20 steps minus
that of the first 20, as the env paid it) exceeds the control's gain by more than 3
standard errors of the difference: one-sided p < 0.0014 under the normal approximation
(Welch 1947; 80 to 320 independent units per window, so the approximation is good). The
standard error adds the four windows' variances of the mean over independent units:
single dialogues for PPO (320 per window), group means for GRPO (80 per window: a
group's 4 dialogues share persona and opening line). It does not rest on the exact
weights of the rule-based user, only on its scores telling replies apart in a way a
0.3M-parameter random model can move towards in 100 steps (it learns to answer in the
persona's language); the margin is in standard errors, not in emotion points.
Seeded: a run gives the same numbers every time on a given platform. Measured here
(seed 0, one torch thread): PPO gains +0.021, its control -0.016, difference 7.9
standard errors; GRPO +0.051 against -0.012, 7.3 standard errors.
"""

import json

import numpy as np
import pytest

from empathy_gym.agents import TRAINERS, load_recipe
from empathy_gym.agents.controls import shuffled_reward_trainer

#: Standard errors by which the real gain must beat the control's.
MARGIN_SE = 3.0


def window_units(episodes: list[dict], steps: range, algorithm: str) -> np.ndarray:
    """The independent units of a window of steps: dialogue returns (PPO), or the mean
    return of each (step, group) (GRPO: a group's dialogues share persona and opening)."""
    chosen = [e for e in episodes if e["step"] in steps]
    if algorithm == "ppo":
        return np.array([e["return"] for e in chosen])
    groups: dict[tuple[int, int], list[float]] = {}
    for e in chosen:
        groups.setdefault((e["step"], e["group"]), []).append(e["return"])
    return np.array([np.mean(returns) for returns in groups.values()])


def run(tmp_path, algorithm: str, control: bool) -> list[dict]:
    out = tmp_path / ("control" if control else "real")
    config = load_recipe(
        "agents/tiny-cpu.yaml", [f"output_dir={out}", "progress=false", "save_steps=0"], algorithm=algorithm
    )
    assert config.total_steps == 100 and config.rollout_batch_size == 16
    cls = shuffled_reward_trainer(TRAINERS[algorithm]) if control else TRAINERS[algorithm]
    cls(config).train()
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_tiny_recipe_learns_more_than_with_shuffled_rewards(tmp_path, algorithm, measured):
    first, last = range(1, 21), range(81, 101)
    gains, variances = {}, 0.0
    for control in (False, True):
        episodes = run(tmp_path, algorithm, control)
        assert len(episodes) == 1600
        before, after = window_units(episodes, first, algorithm), window_units(episodes, last, algorithm)
        gains[control] = after.mean() - before.mean()
        variances += before.var(ddof=1) / len(before) + after.var(ddof=1) / len(after)
    difference, standard_error = gains[False] - gains[True], float(np.sqrt(variances))
    measured(
        f"tiny recipe, {algorithm}: gain {gains[False]:+.4f}, with shuffled rewards {gains[True]:+.4f}, "
        f"difference {difference:+.4f} = {difference / standard_error:.2f} standard errors"
    )
    assert difference > MARGIN_SE * standard_error
