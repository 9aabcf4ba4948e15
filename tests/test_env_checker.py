"""Gymnasium's own checker on the registered rule-based ids, and the quickstart demo."""

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import empathy_gym

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("env_id", sorted(empathy_gym.BUILTIN_IDS))
def test_check_env_passes_on_builtin_ids(env_id):
    env = gym.make(env_id)
    assert env.spec.nondeterministic is False
    check_env(env.unwrapped, skip_render_check=False)
    # the determinism checks ran: same seed, same opening and same first step
    a, b = gym.make(env_id), gym.make(env_id)
    assert a.reset(seed=5)[0] == b.reset(seed=5)[0]
    assert a.step("I hear you. What happened?")[:4] == b.step("I hear you. What happened?")[:4]


def test_check_env_passes_with_think_mode_and_final_reward():
    check_env(gym.make("EmpathyDialogue-Hard-v0", think=True, reward_mode="final").unwrapped)


def test_quickstart_runs_20_dialogues_on_the_rlver_profiles():
    out = subprocess.run(
        [sys.executable, "examples/quickstart.py", "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "20 dialogues, agent=listener, user=rule: mean final emotion" in out.stdout
    shown = subprocess.run(
        [sys.executable, "examples/quickstart.py", "--episodes", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "=== episode 1/1 ===" in shown.stdout and "rewards:" in shown.stdout
    assert "emotion [" in shown.stdout  # the emotion bar of the transcript


def test_quickstart_says_its_default_personas_are_chinese_and_how_to_pick_english():
    note = (
        "personas: EmpathyDialogue-RLVER-v0's own (500 personas, zh 500): the dialogues are in Chinese; "
        "--personas en for English ones"
    )
    default = subprocess.run(
        [sys.executable, "examples/quickstart.py", "--quiet", "--episodes", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert default.returncode == 0, default.stderr
    assert default.stdout.splitlines()[0] == note
    english = subprocess.run(
        [sys.executable, "examples/quickstart.py", "--quiet", "--episodes", "1", "--personas", "en"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert english.returncode == 0, english.stderr
    assert english.stdout.splitlines()[0] == "personas: en (48 personas, en 48): the dialogues are in English"
    assert "1 dialogues, agent=listener" in english.stdout
