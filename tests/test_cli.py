"""The ``empathy-gym`` command: personas, envs, eval end to end, play in a pseudo-terminal."""

import configparser
import contextlib
import importlib
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from empathy_gym.cli import app
from empathy_gym.evaluation.benchmark import evaluate

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

GOOD = {
    "id": "g1",
    "language": "en",
    "name": "Ana",
    "profile": "Ana, 30, nurse.",
    "scenario": "Ana was blamed for a colleague's error.",
    "hidden_intention": "not_at_fault",
    "character_type": "negative",
    "opening_line": "So it's my fault now.",
}
RLVER = {
    "id": "r1",
    "player": "* 姓名：王丽娜",
    "scene": "她被误会了。",
    "main_cha": "负面型",
    "cha_group": ["敏感"],
    "task": "你希望对方深刻共情你的感受，而不是简单的安慰",
    "first_talk": "我真的受够了。",
}


def write_jsonl(path, *lines):
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line, ensure_ascii=False)) + "\n" for line in lines),
        encoding="utf-8",
    )
    return path


def test_the_console_script_points_at_main():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    entry = config["options.entry_points"]["console_scripts"].strip()
    name, target = (part.strip() for part in entry.split("="))
    module, attr = target.split(":")
    assert name == "empathy-gym" and callable(getattr(importlib.import_module(module), attr))


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["eval"],
        ["replay"],
        ["play"],
        ["envs"],
        ["personas"],
        ["personas", "validate"],
        ["personas", "list"],
        ["personas", "show"],
    ],
)
def test_every_command_has_help(args):
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "Usage: empathy-gym" in result.output
    assert "130 interrupted" in result.output  # the exit codes are documented everywhere
    assert "…" not in result.output  # no word of the help cut in a terminal 80 columns wide


def test_validate_accepts_both_formats(tmp_path):
    path = write_jsonl(tmp_path / "ok.jsonl", GOOD, RLVER)
    result = runner.invoke(app, ["personas", "validate", str(path)])
    assert result.exit_code == 0, result.output
    assert f"ok: {path}: 2 personas (1 en, 1 zh)" in result.stdout


@pytest.mark.parametrize(
    "lines, where",
    [
        (
            [GOOD, {**GOOD, "id": "g2", "character_type": "cheerful"}],
            ":2: field 'character_type': 'cheerful' is not one of",
        ),
        ([GOOD, GOOD], ":2: field 'id': duplicate persona id 'g1' (first on line 1)"),
        ([GOOD, "", '{"id": "g3", "language": "en"'], ":3: not valid JSON"),
        (
            [{k: v for k, v in GOOD.items() if k != "scenario"}],
            ":1: field 'scenario': 'scenario' is a required property",
        ),
        ([{**RLVER, "main_cha": "乐观型"}], ":1: field 'main_cha': unknown character type '乐观型'"),
    ],
)
def test_validate_names_file_line_and_field(tmp_path, lines, where):
    path = write_jsonl(tmp_path / "bad.jsonl", *lines)
    result = runner.invoke(app, ["personas", "validate", str(path)])
    assert result.exit_code == 1
    assert f"invalid: {path}{where}" in result.stderr


def test_validate_reports_every_invalid_line_not_just_the_first(tmp_path):
    path = write_jsonl(
        tmp_path / "bad.jsonl", GOOD, '{"id": ', {**GOOD, "id": "g2", "language": "fr"}, GOOD, {**GOOD, "id": "g3"}
    )
    result = runner.invoke(app, ["personas", "validate", str(path)])
    assert result.exit_code == 1
    reported = [line.split(": ", 1)[1] for line in result.stderr.splitlines() if line.startswith("invalid: ")]
    assert [line.split(": ")[0] for line in reported] == [f"{path}:2", f"{path}:3", f"{path}:4"]
    assert "field 'id': duplicate persona id 'g1' (first on line 1)" in reported[2]


def test_validate_checks_every_file_and_fails_if_any_is_invalid(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", GOOD)
    missing = tmp_path / "missing.jsonl"
    result = runner.invoke(app, ["personas", "validate", str(missing), str(good)])
    assert result.exit_code == 1
    assert f"invalid: {missing}: No such file or directory" in result.stderr
    assert f"ok: {good}: 1 persona (1 en)" in result.stdout
    assert runner.invoke(app, ["personas", "validate"]).exit_code == 2  # usage: no path


def test_personas_list_piped_is_one_whole_line_per_persona():
    """Piped (CliRunner is not a terminal), ids and names are neither wrapped nor cut at
    80 columns (rich's table did both)."""
    from empathy_gym.personas import load_personas

    listed = runner.invoke(app, ["personas", "list", "--bank", "rlver"])
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.stdout.splitlines()
    assert header.split("\t") == ["id", "lang", "name", "hidden_intention", "character"]
    bank = load_personas("rlver")
    assert [row.split("\t")[0] for row in rows] == [p.id for p in bank]
    assert [row.split("\t")[3] for row in rows] == [p.hidden_intention for p in bank]


def test_replay_piped_prints_whole_tables(tmp_path):
    """Piped, without COLUMNS, rich cut the replay tables to 80 columns ("gemi…", "logg…")."""
    logs = Path(__file__).parent / "data" / "sage_logs" / "gemini-2.5-flash-nothink_based_simulator"
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "empathy_gym.cli",
            "replay",
            str(logs),
            "--user",
            "rule",
            "--out",
            str(tmp_path / "replay"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "gemini-2.5-flash-nothink/openai-o1" in result.stdout and "predicted mean" in result.stdout
    assert "…" not in result.stdout


def test_personas_list_and_show():
    listed = runner.invoke(app, ["personas", "list", "--bank", "zh"])
    assert listed.exit_code == 0, listed.output
    assert "zh-004-widow-grief\tzh\t" in listed.stdout and len(listed.stdout.splitlines()) == 1 + 8
    shown = runner.invoke(app, ["personas", "show", "zh-004-widow-grief", "--json"])
    assert shown.exit_code == 0, shown.output
    record = json.loads(shown.stdout)
    assert (record["hidden_intention"], record["character_type"]) == ("deep_empathy", "negative")
    plain = runner.invoke(app, ["personas", "show", "en-001-warehouse-warning"])
    assert "not_at_fault (wants to hear that they are not at fault)" in plain.stdout
    missing = runner.invoke(app, ["personas", "show", "nobody"])
    assert missing.exit_code == 1
    assert "no persona 'nobody' in en, zh, adversarial, rlver" in missing.stderr
    assert runner.invoke(app, ["personas", "list", "--bank", "klingon"]).exit_code == 1


def test_envs_lists_the_builtin_ids():
    result = runner.invoke(app, ["envs"])
    assert result.exit_code == 0, result.output
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in result.stdout.splitlines()
        if line.startswith("│")
    }
    assert rows["EmpathyDialogue-RLVER-v0"] == ["moderate", "500", "zh 500", "rule"]
    assert rows["EmpathyDialogue-Hard-v0"] == ["challenging", "56", "en 48, zh 8", "rule"]
    assert {"EmpathyDialogue-v0", "EmpathyDialogue-Easy-v0"} <= set(rows)
    assert "also EmpathyStrategy-v0 (empathy_gym.integrations.strategy_env:EmpathyStrategyEnv)" in result.stdout


def test_eval_on_the_rlver_bank_end_to_end(tmp_path):
    out = tmp_path / "run"
    args = [
        "eval",
        "--personas",
        "rlver",
        "--policy",
        "baseline:listener",
        "--user",
        "rule",
        "--limit",
        "4",
        "--out",
        str(out),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    records = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    finals = [r["final_emotion"] for r in records]
    assert report["dialogues"] == len(records) == 4
    assert report["sentient_score"] == pytest.approx(sum(finals) / 4)
    assert report["successes"] == sum(r["termination"] == "success" for r in records)
    assert report["config"]["policy"] == "baseline:listener" and report["config"]["user"] == "rule"
    assert all(r["emotions"][0] == 40 and r["turns"] <= 10 for r in records)  # SAGE protocol
    assert f"Sentient score {report['sentient_score']:.1f}" in result.stdout
    assert (out / "trajectories.png").stat().st_size > 0
    # the same run through the Python API gives the same report
    api = evaluate("baseline:listener", "rlver", user="rule", limit=4)
    assert api.report == report
    # a rerun resumes everything and writes the same report
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "4 resumed" in again.stdout
    assert f"resuming: found 4 of 4 dialogues done in {out}" in again.stdout  # issue 37: said at the start
    assert "resuming" not in result.stdout
    assert json.loads((out / "report.json").read_text()) == report


def test_a_long_eval_shows_turns_and_the_time_left_on_a_terminal(tmp_path, monkeypatch):
    """Issue 37: dialogues end together near the end of a batched evaluation, so a second
    bar counts turns and estimates the time left from the rounds played (rounds come
    minutes apart: the estimate keeps every round, not rich's 30 s window). 32 turns in
    0.3 s or more, 368 left: 3.45 s or more."""
    import io

    from rich.console import Console

    import empathy_gym.cli as cli

    screen = io.StringIO()
    monkeypatch.setattr(cli, "errors", Console(file=screen, force_terminal=True, width=120))
    with cli._resumable("dialogues", "saved", tmp_path / "run") as bars:
        bars.on_progress(0, 48)
        bars.on_turns(0, 432)
        time.sleep(0.3)
        bars.on_turns(32, 432)
        time.sleep(0.3)
        bars.on_turns(64, 432)
        time.sleep(0.2)
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    left = re.search(r"turns \(at most\) \S+\s+64/432 \d:\d\d:\d\d (\d):(\d\d):(\d\d)", shown)
    assert left, shown[-400:]
    assert int(left[1]) * 3600 + int(left[2]) * 60 + int(left[3]) >= 3  # at least 368 / 32 x 0.3 s
    assert re.search(r"dialogues\s+\S+\s+0/48", shown)


def test_eval_input_errors_exit_1_and_usage_errors_exit_2(tmp_path):
    out = str(tmp_path / "run")
    bad_policy = runner.invoke(app, ["eval", "--policy", "baseline:nope", "--out", out])
    assert bad_policy.exit_code == 1 and "unknown baseline 'nope'" in bad_policy.stderr
    assert not (tmp_path / "run").exists()  # nothing written for a run that never started
    bad_user = runner.invoke(app, ["eval", "--policy", "baseline:echo", "--user", "openai:m", "--out", out])
    assert bad_user.exit_code == 1 and "expected openai:MODEL@URL" in bad_user.stderr
    bad_bank = write_jsonl(tmp_path / "bank.jsonl", {**GOOD, "language": "fr"})
    invalid = runner.invoke(app, ["eval", "--policy", "baseline:echo", "--personas", str(bad_bank), "--out", out])
    assert invalid.exit_code == 1 and f"{bad_bank}:1: field 'language'" in invalid.stderr
    assert runner.invoke(app, ["eval", "--policy", "baseline:echo"]).exit_code == 2  # no --out
    assert runner.invoke(app, ["eval", "--policy", "baseline:echo", "--out", out, "--limit", "0"]).exit_code == 2


def test_ctrl_c_exits_130_and_a_rerun_resumes(tmp_path, monkeypatch):
    # A policy module that raises KeyboardInterrupt once, on its 5th call.
    (tmp_path / "flaky_agent.py").write_text(
        "calls = 0\n"
        "def reply(messages):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    if calls == 5:\n"
        "        raise KeyboardInterrupt\n"
        "    return 'That sounds hard. What happened?'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    args = [
        "eval",
        "--personas",
        "en",
        "--policy",
        "python:flaky_agent:reply",
        "--limit",
        "3",
        "--batch-size",
        "1",
        "--out",
        str(out),
    ]
    interrupted = runner.invoke(app, args)
    assert interrupted.exit_code == 130
    assert "rerun the same command to resume" in interrupted.stderr
    assert not (out / "report.json").exists()
    resumed = runner.invoke(app, args)
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((out / "report.json").read_text())["dialogues"] == 3


def test_a_user_server_that_fails_mid_run_says_what_is_kept_and_how_to_resume(tmp_path):
    """Was: the server's error alone (Ctrl-C said that the same command resumes)."""
    import socket

    port = socket.socket()
    port.bind(("127.0.0.1", 0))  # bound, never listening: the connection is refused
    url = f"http://127.0.0.1:{port.getsockname()[1]}/v1"
    args = ["eval", "--policy", "baseline:listener", "--personas", "en", "--limit", "1", "--out", str(tmp_path / "r")]
    result = runner.invoke(app, [*args, "--user", f"openai:m@{url},max_retries=0"])
    port.close()
    assert result.exit_code == 1 and f"is a server running at {url}?" in result.stderr
    saved = tmp_path / "r" / "transcripts.jsonl"
    assert result.stderr.rstrip().endswith(
        f"finished dialogues (if any) are saved in {saved}; rerun the same command to resume"
    )
    refused = runner.invoke(app, [*args, "--user", f"openai:m@{url},max_token=3"])  # nothing ran: no such hint
    assert refused.exit_code == 1 and "rerun" not in refused.stderr
    # nor where the policy's model is not there (was: "... saved; rerun the same command to resume")
    other = ["eval", "--policy", "hf:/no/such/model", "--personas", "en", "--limit", "1", "--out", str(tmp_path / "m")]
    missing = runner.invoke(app, other)
    assert missing.exit_code == 1 and "no such file or folder" in missing.stderr and "rerun" not in missing.stderr


def test_a_python_policy_that_returns_no_str_is_one_error_line(tmp_path, monkeypatch):
    """Was: a rich traceback ending in 'expected 2 str utterances, got 2 items (['int'])'."""
    (tmp_path / "bad_agent.py").write_text("def reply(messages):\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["eval", "--personas", "en", "--limit", "1", "--policy", "python:bad_agent:reply"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert (
        result.stderr.strip() == "error: policy 'python:bad_agent:reply': must return the reply as a str, returned int"
    )


def test_ctrl_c_under_a_pipe_that_died_first_still_exits_130(tmp_path):
    """``eval ... 2>&1 | tee log`` and Ctrl-C: tee dies first, so the "interrupted" line
    fails with EPIPE; it exited 1 (a newcomer's strace: write(2, ...) = -1 EPIPE)."""
    (tmp_path / "flaky_agent.py").write_text("def reply(messages):\n    raise KeyboardInterrupt\n")
    command = [sys.executable, "-m", "empathy_gym.cli", "eval", "--personas", "en", "--limit", "1"]
    command += ["--policy", "python:flaky_agent:reply", "--out", str(tmp_path / "run")]
    environment = {**os.environ, "PYTHONPATH": str(tmp_path)}
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment)
    child.stdout.close()  # tee, gone before the first line
    assert child.wait(timeout=120) == 130
    assert (tmp_path / "run" / "run.json").exists()  # the run started: a rerun resumes it


def test_play_stops_when_its_reader_is_gone():
    """``yes hi | empathy-gym play | head -3``: before, it never exited, printing "the dialogue
    has ended" for every line of input into the dead pipe."""
    child = subprocess.Popen(
        [sys.executable, "-m", "empathy_gym.cli", "play"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    with contextlib.suppress(BrokenPipeError):
        child.stdin.write(b"hi\n" * 30)  # the dialogue ends on its own (max_turns)
        child.stdin.flush()
        for _ in range(3):
            child.stdout.readline()
        child.stdout.close()  # head -3, gone
        for _ in range(2000):  # yes hi: far more lines than any dialogue has turns
            child.stdin.write(b"hi\n")
            child.stdin.flush()
    try:  # stdin stays open, as under `yes`: the old loop then waited for more input
        assert child.wait(timeout=120) == 141
    finally:
        child.kill()
        with contextlib.suppress(BrokenPipeError):
            child.stdin.close()


@pytest.mark.parametrize(
    "args", [["envs"], ["eval", "--policy", "baseline:listener", "--personas", "en", "--limit", "2"]]
)
def test_a_reader_gone_before_the_output_exits_141_after_the_work(args, tmp_path):
    """``empathy-gym envs | head -1`` exited 1 with no message (Click's answer to EPIPE),
    which the help reserves for a failed run; an eval whose report could not be printed
    had done and saved its work, as a program killed by SIGPIPE would say: 141."""
    if args[0] == "eval":
        args = [*args, "--out", str(tmp_path / "run")]
    child = subprocess.Popen([sys.executable, "-m", "empathy_gym.cli", *args], stdout=subprocess.PIPE)
    child.stdout.close()  # head, gone before the first line
    assert child.wait(timeout=120) == 141
    if args[0] == "eval":
        assert json.loads((tmp_path / "run" / "report.json").read_text())["dialogues"] == 2


def test_eval_with_a_transformers_policy(tiny_model_dir, tmp_path):
    bank = write_jsonl(tmp_path / "bank.jsonl", GOOD, {**GOOD, "id": "g2"})
    result = runner.invoke(
        app,
        [
            "eval",
            "--personas",
            str(bank),
            "--policy",
            f"hf:{tiny_model_dir},device=cpu",
            "--max-tokens",
            "6",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (tmp_path / "run" / "transcripts.jsonl").read_text().splitlines()]
    assert sorted(r["persona_id"] for r in records) == ["g1", "g2"]
    for record in records:  # one policy reply per turn, each a str
        replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        assert len(replies) == record["turns"] >= 1 and all(isinstance(t, str) for t in replies)


# -- play in a pseudo-terminal -------------------------------------------------------
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
TURN = re.compile(r"\[[#-]{20}\]\s+(\d+)/100\s+\(([+-]\d+), turn (\d+)/9\)")  # SAGE: 9 appraised turns


class Terminal:
    """``empathy-gym play`` on a pseudo-terminal; reads until the next prompt."""

    def __init__(self, *args):
        self.fd, child = pty.openpty()
        env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "COLUMNS": "200", "TERM": "xterm"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "empathy_gym.cli", "play", *args],
            stdin=child,
            stdout=child,
            stderr=child,
            env=env,
            cwd=ROOT,
            close_fds=True,
        )
        os.close(child)
        self.transcript = ""

    def read_until(self, marker, limit=120.0):
        """Everything up to and including ``marker`` (a safety limit, not a timing check)."""
        buffer, deadline = "", time.monotonic() + limit
        while marker not in buffer:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {marker!r} in the output: {self.transcript + buffer!r}")
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            if not chunk:
                break
            buffer += ANSI.sub("", chunk.decode("utf-8", errors="replace"))
        self.transcript += buffer
        return buffer

    def send(self, line, until="you> "):
        """Type ``line`` and Enter; the output up to ``until`` (``None``: to the end)."""
        os.write(self.fd, (line + "\n").encode("utf-8"))
        return self.read_until(until) if until else self.read_until("\x00")  # no NUL: reads to EOF

    def close(self):
        os.close(self.fd)
        return self.process.wait(timeout=60)


def test_play_in_a_pseudo_terminal():
    opening = "Twenty-two years on that floor and I'm the one holding a warning letter."
    term = Terminal("--persona", "en-001-warehouse-warning", "--seed", "0")
    try:
        start = term.read_until("you> ")
        assert "persona en-001-warehouse-warning (Dariusz Nowak)" in start
        assert opening in start and "[########------------]  40/100" in start  # SAGE starts at 40
        first = TURN.search(term.send("That sounds exhausting. What happened with the gate?"))
        second = TURN.search(term.send("You reported it twice in writing. That was not your failure."))
        assert first and second, term.transcript
        (e1, c1, t1), (e2, c2, t2) = first.groups(), second.groups()
        assert (t1, t2) == ("1", "2")
        assert int(e1) == 40 + int(c1) and int(e2) == int(e1) + int(c2)  # the bar follows the changes
        assert "/restart" in term.send("/help")
        restarted = term.send("/restart")
        assert opening in restarted and "40/100" in restarted  # a fresh dialogue
        third = TURN.search(term.send("I'm listening."))
        assert third and third.group(3) == "1"
        term.send("/quit", until=None)
    finally:
        code = term.close()
    assert code == 0
    assert term.transcript.count("you> ") == 6  # start, 2 turns, /help, /restart, 1 turn


# -- a newcomer's first runs: languages, reply caps, the hidden need -------------------
def test_eval_says_which_persona_bank_and_language_it_runs(tmp_path):
    result = runner.invoke(
        app, ["eval", "--policy", "baseline:listener", "--limit", "1", "--out", str(tmp_path / "sage")]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        "personas: sage (100 personas, zh 100): the dialogues are in Chinese; --personas en for English ones"
    )
    english = runner.invoke(
        app,
        ["eval", "--policy", "baseline:listener", "--personas", "en", "--limit", "1", "--out", str(tmp_path / "en")],
    )
    assert english.stdout.splitlines()[0] == "personas: en (48 personas, en 48): the dialogues are in English"


def test_bank_language_line_for_a_mixed_bank():
    from empathy_gym.cli import bank_language_line
    from empathy_gym.personas import load_personas

    assert bank_language_line("default", load_personas(None)) == (
        "personas: default (56 personas, en 48, zh 8): some dialogues are in Chinese; "
        "--personas en for English ones only"
    )
    one = load_personas("en")[:1]  # was "1 personas"
    assert bank_language_line("one.jsonl", one) == "personas: one.jsonl (1 persona, en 1): the dialogues are in English"


class RecordingBackend:
    """Stands in for a local model: records the ``max_tokens`` (and sampling) of each call."""

    def __init__(self):
        self.calls, self.sampling = [], []

    def generate(self, conversations, *, max_tokens=256, temperature=0.7, top_p=1.0, seeds=None):
        self.calls.append(max_tokens)
        self.sampling.append((temperature, top_p))
        return ["That sounds hard. What happened?"] * len(conversations)

    def close(self):
        pass


@pytest.mark.parametrize(("option", "expected"), [([], 128), (["--max-tokens", "6"], 6), (["--max-tokens", "0"], None)])
def test_local_policies_get_a_default_reply_cap(tmp_path, monkeypatch, option, expected):
    import empathy_gym.evaluation.policies

    backend = RecordingBackend()
    monkeypatch.setattr(
        empathy_gym.evaluation.policies, "load_transformers_policy", lambda model, adapter=None, **kwargs: backend
    )
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["eval", "--policy", "hf:some/model", "--personas", "en", "--limit", "2", "--out", str(out), *option]
    )
    assert result.exit_code == 0, result.output
    assert backend.calls and set(backend.calls) == {expected}
    assert json.loads((out / "report.json").read_text())["config"]["generation"]["max_tokens"] == expected
    notice = "replies: at most 128 new tokens (the default for local policies; --max-tokens N to change, 0 for no cap)"
    assert (notice in result.stdout.splitlines()) == (option == [])


@pytest.mark.parametrize(("max_tokens", "expected"), [(None, 128), (6, 6), (0, None)])
def test_evaluate_from_python_caps_local_policies_as_the_command_line_does(monkeypatch, max_tokens, expected):
    import empathy_gym.evaluation.policies
    from empathy_gym.evaluation.benchmark import evaluate

    backend = RecordingBackend()
    monkeypatch.setattr(
        empathy_gym.evaluation.policies, "load_transformers_policy", lambda model, adapter=None, **kwargs: backend
    )
    result = evaluate("hf:some/model", "en", limit=1, max_tokens=max_tokens, n_resamples=100)
    assert backend.calls and set(backend.calls) == {expected}
    assert result.report["config"]["generation"]["max_tokens"] == expected


def test_reply_token_cap():
    from empathy_gym.evaluation.policies import reply_token_cap

    assert reply_token_cap("hf:Qwen/Qwen2.5-0.5B-Instruct,device=cpu", None) == 128
    assert reply_token_cap("transformers:model", None) == 128
    assert reply_token_cap("hf:model", 64) == 64
    assert reply_token_cap("hf:model", 0) is None
    assert reply_token_cap("openai:qwen@http://localhost:8000/v1", None) is None
    assert reply_token_cap("baseline:listener", None) is None


def test_difficulty_help_lists_the_shipped_presets(tmp_path):
    """A preset added to envs/difficulty/ shows in the help (it was a hard-coded list)."""
    (tmp_path / "difficulty").mkdir()
    for name in ("gentle", "moderate"):
        (tmp_path / "difficulty" / f"{name}.json").write_text("{}")
    code = (
        "import pathlib, sys, empathy_gym.user.difficulty as d\n"
        "d.envs_dir = lambda: pathlib.Path(sys.argv[1])\n"
        "from empathy_gym.cli import DIFFICULTY_HELP\nprint(DIFFICULTY_HELP)"
    )
    shown = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert shown.stdout.strip() == "gentle | moderate | a preset JSON path"


def test_user_help_offers_no_user_that_only_a_trainer_builds():
    from empathy_gym.cli import USER_HELP

    assert "openai:MODEL@URL;" in USER_HELP and "policy" not in USER_HELP


def test_eval_help_names_the_default_reply_cap():
    shown = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"}).stdout
    assert (
        "model policies: new tokens per reply; default: 128 for local (hf:) policies, no cap for "
        "openai: ones (as SAGE); 0: no cap"
    ) in shown


PLAY = ["play", "--persona", "en-001-warehouse-warning", "--seed", "0"]
HIDDEN = "Hidden need: wants to hear that they are not at fault; character: negative."


@pytest.mark.parametrize("leave", ["/quit\n", "", "/restart\n/quit\n"])
def test_play_reveals_the_hidden_need_when_the_player_leaves(leave):
    result = runner.invoke(app, PLAY, input="I'm sorry to hear that.\n" + leave)
    assert result.exit_code == 0, result.output
    lines = [line.removeprefix("you> ") for line in result.stdout.splitlines()]  # input is not echoed
    assert f"you left the dialogue. {HIDDEN}" in lines
    assert result.stdout.count(HIDDEN) == (2 if leave.startswith("/restart") else 1)


def test_play_reveals_the_hidden_need_once_at_the_end_of_a_dialogue():
    result = runner.invoke(app, PLAY, input="I'm sorry to hear that.\n" * 5 + "/quit\n")
    assert result.exit_code == 0, result.output
    assert f"failure: the user gives up and leaves (final emotion 0). {HIDDEN}" in result.stdout.splitlines()
    assert result.stdout.count(HIDDEN) == 1  # /quit after the end does not repeat it


def test_a_policy_spec_says_how_it_samples_and_the_run_records_it(tmp_path, monkeypatch):
    import empathy_gym.evaluation.policies

    backend, loaded_with = RecordingBackend(), []
    monkeypatch.setattr(
        empathy_gym.evaluation.policies,
        "load_transformers_policy",
        lambda model, adapter=None, **kwargs: loaded_with.append(kwargs) or backend,
    )
    out = tmp_path / "run"
    args = ["eval", "--policy", "hf:some/model,device=cpu,temperature=0,top_p=0.9", "--personas", "en"]
    result = runner.invoke(app, [*args, "--limit", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert loaded_with == [{"device": "cpu"}]  # the sampling options do not reach the model loader
    assert set(backend.sampling) == {(0.0, 0.9)}
    generation = json.loads((out / "report.json").read_text())["config"]["generation"]
    assert generation == {"max_tokens": 128, "temperature": 0.0, "top_p": 0.9}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("hf:some/model,foo=1", "'hf:some/model,foo=1': unknown option(s) ['foo']; a hf policy takes adapter,"),
        ("hf:some/model,temperature=-1", "'hf:some/model,temperature=-1': temperature must be >= 0, got -1"),
        ("openai:m@http://127.0.0.1:9/v1,top_p=abc", "top_p must be a number, got 'abc'"),
        ("baseline:listener,temperature=0", "unknown option(s) ['temperature']; a baseline policy takes no options"),
    ],
)
def test_a_bad_policy_spec_is_refused_before_any_model_loads(tmp_path, monkeypatch, spec, message):
    """Was: a traceback (TypeError from the backend) after loading, a bare 'could not
    convert string to float', temperature=-1 refused at the first reply, the baseline's
    option ignored."""
    import empathy_gym.evaluation.policies

    def never(*args, **kwargs):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(empathy_gym.evaluation.policies, "load_transformers_policy", never)
    result = runner.invoke(app, ["eval", "--policy", spec, "--personas", "en", "--limit", "1", "--out", str(tmp_path)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert message in " ".join(result.stderr.split())
    assert not (tmp_path / "run.json").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--persona", "nope"],
            "--persona 'nope': not in EmpathyDialogue-v0's 56 personas; see `empathy-gym personas list`",
        ),
        (["--env", "Nope-v0"], "--env Nope-v0: not a dialogue env; the registered ones: EmpathyDialogue-Easy-v0"),
    ],
)
def test_play_names_a_wrong_persona_or_env_in_the_options_terms(args, message):
    """Was: options['persona']: unknown persona id (the env's internals), and gymnasium's
    'Did you mean: Hopper?'."""
    result = runner.invoke(app, ["play", *args], input="/quit\n")
    assert result.exit_code == 1
    assert message in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    "entry",
    [
        "from empathy_gym.agents.cli import train_main; train_main('grpo', ['--recipe', 'no-such-recipe.yaml'])",
        "import sys; sys.argv = ['empathy-gym', '--help']\nfrom empathy_gym.cli import main\n"
        "try: main()\nexcept SystemExit: pass",
    ],
    ids=["train", "empathy-gym"],
)
def test_ctrl_c_and_sigterm_are_honoured_in_every_phase_of_a_background_job(entry):
    # a background job of a non-interactive shell inherits SIGINT as ignored; before, the
    # training command kept ignoring it until training began (the trainer's handler), so a
    # Ctrl-C during loading or the held-out evaluation was lost and a later one honoured.
    # SIGTERM, before: outside the training loop (loading, the held-out evaluations, eval)
    # it killed the command at once (exit 143, no message), where docs/training.md says it
    # stops like Ctrl-C (exit 130, what is kept, rerun to resume).
    check = (
        "\nimport signal; print(all(signal.getsignal(s) is signal.default_int_handler"
        " for s in (signal.SIGINT, signal.SIGTERM)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", entry + check],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert done.stdout.strip().splitlines()[-1] == "True", done.stdout + done.stderr


def test_the_stop_message_says_what_was_kept_and_nothing_that_is_not_there(tmp_path):
    # before: "finished dialogues are in <dir>/episodes.jsonl" also when a Ctrl-C during the
    # held-out evaluation before training had left no such file
    from empathy_gym.agents.cli import what_is_kept

    assert what_is_kept(str(tmp_path)) == (
        "no training dialogue had finished yet; no checkpoint yet; rerun with --resume to continue"
    )
    (tmp_path / "episodes.jsonl").write_text('{"step": 1}\n', encoding="utf-8")
    (tmp_path / "checkpoints" / "step-000010").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-000010" / "state.json").write_text("{}", encoding="utf-8")
    assert what_is_kept(str(tmp_path)) == (
        f"finished dialogues are in {tmp_path / 'episodes.jsonl'}; the last checkpoint is "
        f"{tmp_path / 'checkpoints' / 'step-000010'}; rerun with --resume to continue from it"
    )


def test_the_training_commands_take_options_between_overrides():
    """Was: `train_grpo.py --recipe r output_dir=x --resume total_steps=2` failed with
    "unrecognized arguments: total_steps=2" (argparse stops the overrides at an option)."""
    from empathy_gym.agents.cli import parse_args

    args = parse_args(
        "grpo", ["--recipe", "r", "output_dir=x", "--resume", "total_steps=2", "--output-dir", "y", "a=1"]
    )
    assert args.resume and args.output_dir == "y" and args.overrides == ["output_dir=x", "total_steps=2", "a=1"]


def test_the_training_command_refuses_another_kind_of_run_and_a_file_before_loading(tmp_path, capsys, monkeypatch):
    """Was: --resume into an eval's folder said "holds no run to continue; run without
    --resume" (which then refused it), or, with an empty metrics.jsonl there, trained into it;
    an output_dir that is a file failed with "[Errno 17] File exists" after the model loaded."""
    from empathy_gym.agents import cli

    monkeypatch.setattr(cli, "_train", lambda *args, **kwargs: pytest.fail("a model was loaded"))
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "transcripts.jsonl").write_text("")
    (tmp_path / "eval" / "metrics.jsonl").write_text("")
    recipe = ["--recipe", "agents/tiny-cpu.yaml"]
    assert cli.train_main("grpo", [*recipe, "--resume", f"output_dir={tmp_path / 'eval'}"]) == 1
    assert "error: --resume: " in (err := capsys.readouterr().err) and "another kind of run: eval" in err
    assert cli.train_main("grpo", [*recipe, f"output_dir={tmp_path / 'eval'}"]) == 1
    assert "holds another kind of run: eval (transcripts.jsonl)" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert cli.train_main("grpo", [*recipe, f"output_dir={tmp_path / 'file'}"]) == 1
    assert "is a file; give a folder (new, or a run to resume)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "raised,code,message",
    [(KeyboardInterrupt, 130, "stopped before the first step; nothing to save"), (ImportError, 1, "error: broken")],
)
def test_ctrl_c_or_a_broken_install_while_the_trainer_imports_stops_with_its_message(raised, code, message, capsys):
    """Was: UnboundLocalError ('MemoryPlanError'): the error clause named a class imported
    after the one that failed, and it was evaluated before the Ctrl-C clause."""
    import types

    from empathy_gym.agents import cli
    from empathy_gym.agents.config import load_recipe

    class Failing(types.ModuleType):
        def __getattr__(self, name):
            if name == "CheckpointError":  # the failure lands while it is imported
                raise raised("broken")
            raise AttributeError(name)

    config = load_recipe("agents/tiny-cpu.yaml", [], algorithm="grpo")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "empathy_gym.agents.checkpoint", Failing("empathy_gym.agents.checkpoint"))
        assert cli._train("grpo", config, False) == code
    assert message in capsys.readouterr().err
