"""Every measured table under benchmarks/results/ says where it came from (issue 37): the
commit of the code that made it and the command that ran, so a reader can tell whether
it went stale and rerun it; and a result quoted in the README, the docs or a recipe fails
a test once what it was measured on (the rule user's behaviour, the shipped appraiser, a
recipe: benchmarks/_inputs.py) has changed."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from script_modules import load_script

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.txt"))
QUOTING = [
    ROOT / "README.md",
    *sorted(ROOT.glob("docs/**/*.md")),
    *sorted(ROOT.glob("agents/*.yaml")),
    *sorted(ROOT.glob("empathy_gym/**/*.md")),
]
QUOTED = [path for path in RESULTS if any(path.name in quoting.read_text(encoding="utf-8") for quoting in QUOTING)]
COMMIT = re.compile(r"\bcommit:? ([0-9a-f]{7,40})\b")
COMMAND = re.compile(r"python \S*(?:benchmarks|examples)/\S+\.py|\bpytest |\.ci/run|\bempathy-gym [a-z]+")


def provenance_problems(text: str) -> list[str]:
    """What a results file's text fails to name: ``"commit"`` and/or ``"command"``."""
    return [name for name, pattern in (("commit", COMMIT), ("command", COMMAND)) if not pattern.search(text)]


def test_the_check_catches_a_table_without_its_commit_or_command():
    assert provenance_problems("steps/s 7135\n") == ["commit", "command"]
    assert provenance_problems("# python benchmarks/env_overhead.py\nsteps/s 7135\n") == ["commit"]
    assert provenance_problems("# run at commit 8d14010\n") == ["command"]
    assert provenance_problems("# commit: 6279b19, python benchmarks/distilled_training.py --seeds 0\n") == []


inputs = load_script(ROOT / "benchmarks" / "_inputs.py")


def test_the_opening_line_benchmarks_write_passes_the_check(monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "busy_cores.py"), "--steps", "4", "a b"])
    machine = load_script(ROOT / "benchmarks" / "_machine.py")
    line = machine.provenance()
    assert line.startswith("# run: ") and not provenance_problems(line), line
    assert line.endswith(", command: python benchmarks/busy_cores.py --steps 4 'a b'"), line
    with_inputs = machine.provenance(inputs=["recipe agents/tiny-cpu.yaml"]).splitlines()
    without = machine.provenance(no_inputs="a timing").splitlines()
    for lines in (with_inputs, without):  # the same line (but its minute), then the inputs
        assert len(lines) == 2 and lines[0].partition(", commit")[2] == line.partition(", commit")[2], lines
    assert stale_inputs(with_inputs[1]) == {} and with_inputs[1].startswith("# inputs: recipe agents/tiny-cpu.yaml ")
    assert without[1] == "# inputs: none (a timing)" and stale_inputs(without[1]) == {}


@pytest.mark.parametrize("path", RESULTS, ids=[path.name for path in RESULTS])
def test_each_results_file_names_its_commit_and_command(path):
    assert not provenance_problems(path.read_text(encoding="utf-8")), (
        f"{path.relative_to(ROOT)}: names no {' and no '.join(provenance_problems(path.read_text()))}; "
        "open it with benchmarks/_machine.py's provenance() line"
    )


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.skipif(
    _git("rev-parse", "--is-shallow-repository").stdout.strip() != "false",
    reason="not a full git clone: the commits cannot be looked up",
)
def test_the_commits_they_name_exist():
    named = {(path.name, sha) for path in RESULTS for sha in COMMIT.findall(path.read_text(encoding="utf-8"))}
    missing = [
        f"{name}: {sha}" for name, sha in sorted(named) if _git("cat-file", "-e", f"{sha}^{{commit}}").returncode
    ]
    assert not missing, f"results files name commits this repository does not have: {missing}"


@cache
def fingerprint_now(name: str) -> str:
    return inputs.fingerprint(name)


def stale_inputs(text: str) -> dict[str, tuple[str, str]] | None:
    """``{input: (fingerprint recorded, fingerprint now)}`` for each input of a results
    file's text that changed; ``None`` when the text names no inputs."""
    recorded = inputs.parse_inputs(text)
    if recorded is None:
        return None
    return {name: (was, fingerprint_now(name)) for name, was in recorded if fingerprint_now(name) != was}


def test_the_inputs_line_reads_back_and_a_changed_input_is_caught():
    line = inputs.inputs_line(["rule-user", "recipe agents/tiny-cpu.yaml"])
    assert re.fullmatch(r"# inputs: rule-user [0-9a-f]{10}, recipe agents/tiny-cpu\.yaml [0-9a-f]{10}", line), line
    assert stale_inputs(f"# run: ...\n{line}\ntable\n") == {}
    assert inputs.parse_inputs("# inputs: none (a timing of a dead URL)\n") == []
    now = fingerprint_now("rule-user")
    assert stale_inputs("# inputs: rule-user 0123456789\n") == {"rule-user": ("0123456789", now)}
    second_section = f"{line}\ntable\n# inputs: rule-user 0123456789\ntable\n"  # a run appended below
    assert stale_inputs(second_section) == {"rule-user": ("0123456789", now)}
    assert stale_inputs("# commit abc1234, python benchmarks/adversarial.py\n") is None
    with pytest.raises(ValueError, match="malformed inputs item 'rule-user'"):
        inputs.parse_inputs("# inputs: rule-user\n")


def test_the_rule_user_fingerprints_follow_behaviour_not_code(monkeypatch):
    from empathy_gym.user import rule_user

    def both() -> tuple[str, str]:
        return inputs.rule_user(), inputs.rule_appraisal()

    before = both()
    assert both() == before
    reply, appraise = rule_user.RuleUser.reply, rule_user.RuleUser.appraise
    monkeypatch.setattr(rule_user.RuleUser, "reply", lambda self, *args, **kwargs: reply(self, *args, **kwargs))
    assert both() == before  # the same behaviour through other code
    monkeypatch.setattr(rule_user.RuleUser, "reply", lambda self, *args: [text + " Hm." for text in reply(self, *args)])
    changed_replies = both()
    assert changed_replies[0] != before[0] and changed_replies[1] == before[1]  # a first turn never reads a reply
    monkeypatch.setattr(rule_user.RuleUser, "reply", reply)

    def one_point_kinder(self, requests):
        return [dataclasses.replace(appraisal, change=appraisal.change + 1) for appraisal in appraise(self, requests)]

    monkeypatch.setattr(rule_user.RuleUser, "appraise", one_point_kinder)
    kinder = both()
    assert kinder[0] != before[0] and kinder[1] != before[1]


def test_a_recipe_fingerprint_ignores_comments_and_layout(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "REPO", tmp_path)
    (tmp_path / "r.yaml").write_text("total_steps: 30\npolicy: {lora_r: 8}\n")
    plain = inputs.recipe("r.yaml")
    (tmp_path / "r.yaml").write_text("# a comment\npolicy:\n  lora_r: 8   # rank\ntotal_steps: 30\n")
    assert inputs.recipe("r.yaml") == plain
    (tmp_path / "r.yaml").write_text("total_steps: 31\npolicy: {lora_r: 8}\n")
    assert inputs.recipe("r.yaml") != plain


@pytest.mark.parametrize("path", QUOTED, ids=[path.name for path in QUOTED])
def test_a_quoted_result_was_measured_on_what_the_checkout_has_now(path):
    changed = stale_inputs(path.read_text(encoding="utf-8"))
    assert changed is not None, (
        f"{path.relative_to(ROOT)} is quoted in the README, docs or recipes but names no inputs: add the line "
        "`python benchmarks/_inputs.py NAME... --at COMMIT` prints for the commit that measured it, or "
        "`# inputs: none (why)`"
    )
    assert not changed, (
        f"{path.relative_to(ROOT)} is quoted in the README, docs or recipes, but what it was measured on changed "
        f"since: {', '.join(f'{name} {was} -> {now}' for name, (was, now) in changed.items())}. Rerun the command it "
        "names and update the quotes, or, where the change cannot move its numbers, say why in the file and record "
        "the new fingerprints (python benchmarks/_inputs.py NAME...)"
    )
