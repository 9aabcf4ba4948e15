"""Fingerprints of what a measured result depends on, so a test can tell when a result
quoted in the README or docs went stale (issue 37; tests/test_results.py).

A results file names its inputs on a line of its own::

    # inputs: rule-user 3f2a9c41d0, recipe agents/smollm2-cpu-grpo.yaml 8be01d77aa

and the test recomputes each one on the checkout it runs on. The kinds:

- ``rule-user``: the rule user's *behaviour*: every reward, emotion and reply of a fixed set
  of dialogues (the default persona bank, the moderate and challenging difficulties, fixed
  replies from caring to word salad). A refactor that keeps behaviour keeps it; a change to
  the appraisal, its lexicons, the reply templates, the difficulty files or the bank changes it.
- ``rule-appraisal``: the part of it a one-turn dialogue (the CPU recipes' ``max_turns: 1``)
  sees: the opening, and the reward and emotion of each fixed reply as the first turn.
- ``distilled``: the bytes of the shipped appraiser (``empathy_gym/user/distilled``).
- ``recipe PATH``: the recipe's parsed YAML (comments and layout do not count).

``# inputs: none (why)`` says that a result depends on none of these (a timing of a
server, a GPU check).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INPUTS_LINE = re.compile(r"^# inputs: (.*)$", re.MULTILINE)

REPLIES = (
    "That sounds really hard. What happened?",
    "Whatever. You'll get over it, everyone does.",
    "I can hear how much you put into this, and it makes sense that it hurts. What would help most right now?",
    "A family drama, I must not be. A family, I am not, a family of a family.",
    "Have you tried just thinking about it differently? Here are three tips: sleep, exercise, and a list.",
    "You did the right thing to say it out loud. I'm proud of you for that, it took courage.",
)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:10]


def rule_user(dialogues: int = 16) -> str:
    """The rule user's behaviour over ``dialogues`` seeds x two difficulties, each played
    to its end with the fixed ``REPLIES`` in a seed-dependent order (the user's last words
    echoed back on every fifth turn). Takes well under a second."""
    import gymnasium as gym

    import empathy_gym  # noqa: F401  (registers the env)

    played = []
    for difficulty in ("moderate", "challenging"):
        env = gym.make("EmpathyDialogue-v0", difficulty=difficulty)
        for seed in range(dialogues):
            observation, info = env.reset(seed=seed)
            turns, done = [[observation, info["emotion"]]], False
            while not done:
                turn = len(turns)
                reply = observation if turn % 5 == 0 else REPLIES[(seed + turn) % len(REPLIES)]
                observation, reward, terminated, truncated, info = env.step(reply)
                turns.append([observation, round(float(reward), 6), info["emotion"], terminated, truncated])
                done = terminated or truncated
            played.append(turns)
        env.close()
    return _digest(json.dumps(played, ensure_ascii=False).encode())


def rule_appraisal(dialogues: int = 16) -> str:
    """The rule user's openings and its appraisal of each of ``REPLIES`` as the first turn,
    over ``dialogues`` seeds x two difficulties (not the replies it writes back)."""
    import gymnasium as gym

    import empathy_gym  # noqa: F401  (registers the env)

    played = []
    for difficulty in ("moderate", "challenging"):
        env = gym.make("EmpathyDialogue-v0", difficulty=difficulty)
        for seed in range(dialogues):
            for reply in REPLIES:
                observation, info = env.reset(seed=seed)
                _, reward, *_, after = env.step(reply)
                played.append([observation, info["emotion"], round(float(reward), 6), after["emotion"]])
        env.close()
    return _digest(json.dumps(played, ensure_ascii=False).encode())


def distilled() -> str:
    """The shipped appraiser's files (``empathy_gym/user/distilled/*`` but its model card)."""
    files = sorted(p for p in (REPO / "empathy_gym" / "user" / "distilled").iterdir() if p.suffix != ".md")
    return _digest(b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in files))


def recipe(path: str) -> str:
    """The recipe at ``path`` (relative to the repository) as parsed YAML."""
    import yaml

    parsed = yaml.safe_load((REPO / path).read_text(encoding="utf-8"))
    return _digest(json.dumps(parsed, sort_keys=True).encode())


def fingerprint(name: str) -> str:
    """The fingerprint of one input named as on an inputs line: ``"rule-user"``,
    ``"rule-appraisal"``, ``"distilled"`` or ``"recipe PATH"``. Raises ValueError for any other name."""
    if name == "rule-user":
        return rule_user()
    if name == "rule-appraisal":
        return rule_appraisal()
    if name == "distilled":
        return distilled()
    if name.startswith("recipe "):
        return recipe(name.removeprefix("recipe "))
    raise ValueError(f"unknown input {name!r}: expected 'rule-user', 'rule-appraisal', 'distilled' or 'recipe PATH'")


def inputs_line(names: list[str]) -> str:
    """``# inputs: NAME FINGERPRINT, ...`` for a results file, computed now."""
    return "# inputs: " + ", ".join(f"{name} {fingerprint(name)}" for name in names)


def parse_inputs(text: str) -> dict[str, str] | None:
    """A results file's first inputs line as ``{name: fingerprint}`` (``{}`` for
    ``none (...)``); ``None`` when it has no inputs line. Raises ValueError on a malformed one."""
    found = INPUTS_LINE.search(text)
    if found is None:
        return None
    if found.group(1).startswith("none"):
        return {}
    inputs = {}
    for item in found.group(1).split(", "):
        name, _, digest = item.strip().rpartition(" ")
        if not name or not re.fullmatch(r"[0-9a-f]{10}", digest):
            raise ValueError(f"malformed inputs item {item!r}: expected 'NAME FINGERPRINT' (10 hex digits)")
        inputs[name] = digest
    return inputs


def at_commit(commit: str, names: list[str]) -> str:
    """The inputs line as it would have been written at ``commit``: the rule user runs
    from a temporary git worktree of that commit (its package first on ``sys.path``)."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tree:
        subprocess.run(["git", "worktree", "add", "--detach", "-q", tree, commit], cwd=REPO, check=True)
        try:
            code = f"import sys; sys.path[:0] = [{tree!r}, {str(REPO / 'benchmarks')!r}]; import _inputs; "
            code += f"_inputs.REPO = __import__('pathlib').Path({tree!r}); print(_inputs.inputs_line({names!r}))"
            done = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"at {commit}: {done.stderr.strip().splitlines()[-1]}")
            return done.stdout.strip()
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=REPO, check=True)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Print a results file's inputs line, now or at a commit.")
    parser.add_argument("names", nargs="+", help="'rule-user', 'rule-appraisal', 'distilled' or 'recipe PATH'")
    parser.add_argument("--at", metavar="COMMIT", help="compute it at this commit (a temporary worktree)")
    args = parser.parse_args()
    print(at_commit(args.at, args.names) if args.at else inputs_line(args.names))
