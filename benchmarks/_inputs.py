"""Fingerprints of what a measured result depends on, so a test can tell when a result
quoted in the README or docs went stale (issue 37; tests/test_results.py).

A results file names its inputs on a line of its own::

    # inputs: rule-user 3f2a9c41d0, recipe agents/smollm2-cpu-grpo.yaml 8be01d77aa

and the test recomputes each one on the checkout it runs on. The kinds:

- ``rule-user``: the rule user's *behaviour*: every emotion change and reply of fixed
  dialogues (:func:`rule_user_dialogues`: the ``en`` and ``zh`` banks, the moderate and
  challenging difficulties). A refactor that keeps behaviour keeps it; a change to the
  appraisal, its lexicons, the reply templates, the difficulty files or the banks changes it.
- ``rule-appraisal``: the part of it a one-turn dialogue (the CPU recipes' ``max_turns: 1``)
  sees: the openings and the first turn's changes.
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

EN = [
    "That sounds really hard. What happened next?",
    "I hear you.",
    "Why don't you just quit?",
    "It makes sense that you feel this way. What do you need now?",
    "I'm here. What? I'm here.",
    "You should try meditation and exercise. 1. Sleep 2. Eat well",
    "It wasn't your fault.",
    "That must have been exhausting at work. How did your manager react?",
    "ok",
    "Thank you for telling me.",
]
ZH = [
    "这确实很不容易。后来发生了什么？",
    "我在听。",
    "你为什么不直接辞职？",
    "难怪你会难过，你现在最需要什么？",
    "我在。什么？我在。",
    "建议你：1. 多运动 2. 早点睡",
    "这不是你的错。",
    "辛苦你了，家里人怎么说？",
    "嗯",
    "谢谢你愿意说出来。",
]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:10]


def rule_user_dialogues(difficulties: tuple[str, ...] = ("moderate", "challenging")) -> dict[str, dict]:
    """The rule user on fixed dialogues: ``{"<bank>/<difficulty>/<seed>": {"opening_sha256",
    "changes", "replies_sha256"}}`` for 12 dialogues per bank (``en``, ``zh``) and
    difficulty, each played with the bank's utterances (``EN``, ``ZH``, caring to dismissive
    to markdown advice) rotated by the seed, every third turn prefixed with the start of
    the user's last reply (the rule user weighs shared words). ``changes``: the emotion
    change of each turn (ints); the digests: SHA-256 of the opening and of every reply.
    tests/data/rule_user_pinned.json keeps them for a refactor to be checked against."""
    import gymnasium as gym

    import empathy_gym  # noqa: F401  (registers the env)

    played = {}
    for difficulty in difficulties:
        for bank, texts in (("en", EN), ("zh", ZH)):
            env = gym.make("EmpathyDialogue-v0", personas=bank, difficulty=difficulty)
            for seed in range(12):
                observation, _ = env.reset(seed=seed)
                replies, changes = [observation], []
                for turn in range(len(texts)):
                    utterance = texts[(seed + turn) % len(texts)]
                    if turn % 3 == 1:
                        utterance = f"{observation[:60]} {utterance}"
                    observation, _, terminated, truncated, info = env.step(utterance)
                    replies.append(observation)
                    changes.append(info["emotion_change"])
                    if terminated or truncated:
                        break
                played[f"{bank}/{difficulty}/{seed}"] = {
                    "opening_sha256": hashlib.sha256(replies[0].encode()).hexdigest(),
                    "changes": changes,
                    "replies_sha256": hashlib.sha256("\n\x00".join(replies).encode()).hexdigest(),
                }
            env.close()
    return played


def rule_user() -> str:
    """Every change and reply of :func:`rule_user_dialogues`."""
    return _digest(json.dumps(rule_user_dialogues(), sort_keys=True).encode())


def rule_appraisal() -> str:
    """What a one-turn dialogue sees of :func:`rule_user_dialogues`: each opening and the
    first turn's change (not the replies written back)."""
    played = rule_user_dialogues()
    first = {key: [dialogue["opening_sha256"], dialogue["changes"][:1]] for key, dialogue in played.items()}
    return _digest(json.dumps(first, sort_keys=True).encode())


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
    raise ValueError(
        f"unknown input {name!r}: expected 'rule-user', 'rule-appraisal', 'distilled' or 'recipe PATH' "
        "(one argument: quote it on a command line)"
    )


def inputs_line(names: list[str]) -> str:
    """``# inputs: NAME FINGERPRINT, ...`` for a results file, computed now."""
    return "# inputs: " + ", ".join(f"{name} {fingerprint(name)}" for name in names)


def parse_inputs(text: str) -> list[tuple[str, str]] | None:
    """Every inputs line of a results file (one per run section) as ``(name, fingerprint)``
    pairs (none for ``none (...)``); ``None`` when it has no inputs line. Raises
    ValueError on a malformed one."""
    lines = INPUTS_LINE.findall(text)
    if not lines:
        return None
    inputs = []
    for line in lines:
        if line.startswith("none"):
            continue
        for item in line.split(", "):
            name, _, digest = item.strip().rpartition(" ")
            if not name or not re.fullmatch(r"[0-9a-f]{10}", digest):
                raise ValueError(f"malformed inputs item {item!r}: expected 'NAME FINGERPRINT' (10 hex digits)")
            inputs.append((name, digest))
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
    import subprocess

    import yaml

    parser = argparse.ArgumentParser(description="Print a results file's inputs line, now or at a commit.")
    parser.add_argument("names", nargs="+", help="'rule-user', 'rule-appraisal', 'distilled' or 'recipe PATH'")
    parser.add_argument("--at", metavar="COMMIT", help="compute it at this commit (a temporary worktree)")
    args = parser.parse_args()
    try:
        print(at_commit(args.at, args.names) if args.at else inputs_line(args.names))
    except (ValueError, OSError, RuntimeError, subprocess.CalledProcessError, yaml.YAMLError) as error:
        parser.error(str(error))
