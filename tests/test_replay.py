"""The replay harness against SAGE's released logs (tests/data/sage_logs: the first three
dialogues of each log; the full logs in ../shared when present): the sage protocol
reproduces SAGE's scores from the logged changes, the harness's report, files, seeds,
resuming and the ``empathy-gym replay`` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from empathy_gym.cli import app
from empathy_gym.evaluation.replay import LoggedUser, agreement, read_logs, replay_logs, replay_with_logged_changes
from empathy_gym.evaluation.sage_logs import leaderboard, read_sage_log
from empathy_gym.seeding import derive_seed
from empathy_gym.user import SimulatorError, resolve_protocol
from empathy_gym.user.base import Appraisal, SimulatedUser

LOGS = Path(__file__).parent / "data" / "sage_logs"
GPT4O = LOGS / "gpt-4o-2024-0806_based_simulator" / "gpt-4o-0806_result.jsonl"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "sage" / "logs"
runner = CliRunner()


def test_the_sage_protocol_gives_sages_score_on_its_logged_changes():
    for path in sorted(LOGS.glob("*/*.jsonl")):
        dialogues = read_sage_log(path)
        replays = [replay_with_logged_changes(d) for d in dialogues]
        for dialogue, replay in zip(dialogues, replays):
            assert replay.matches, (path, dialogue.line, replay, dialogue.emotions)
            assert replay.emotions[-1] == dialogue.final_emotion
            assert replay.steps == sum(t.scored for t in dialogue.turns)
        finals = [r.emotions[-1] for r in replays]
        assert sum(finals) / len(finals) == leaderboard(dialogues)["score"]


def test_the_first_gpt4o_dialogue_by_hand():
    # read off the file: 10 agent replies, 9 appraised (+5 +10 -5 -10 -5 -5 -5 -5 -5), final 15
    dialogue = read_sage_log(GPT4O)[0]
    replay = replay_with_logged_changes(dialogue)
    assert replay.emotions == (40, 45, 55, 50, 40, 35, 30, 25, 20, 15)
    assert (replay.termination, replay.steps) == ("max_turns", 9)
    # appraising the 10th reply, as the env did before (max_turns=10), asks the log for an
    # appraisal SAGE never made: the env does not stop where SAGE stopped
    assert not replay_with_logged_changes(dialogue, resolve_protocol("sage", max_turns=10)).matches
    with pytest.raises(SimulatorError, match="SAGE never appraised it"):
        LoggedUser([dialogue]).appraise([_request(dialogue, 10)])


def _request(dialogue, number):
    from empathy_gym.evaluation.replay import turn_request

    return turn_request(dialogue.turns[number - 1], dialogue.persona)


@pytest.mark.skipif(not SHARED.exists(), reason="no ../shared checkout beside the repo")
def test_every_released_log_is_reproduced_by_the_sage_protocol():
    # SAGE's leaderboard numbers of the released logs (mean emo_point, >= 100, < 10)
    expected = {
        "gemini-2.5-flash-nothink/openai-o1": (30.54, 2, 43),
        "gpt-4o-2024-0806/claude3.7-think": (72.93, 36, 9),
        "gpt-4o-2024-0806/claude3.7": (70.34, 32, 10),
        "gpt-4o-2024-0806/deepseek-v3-1227": (65.6, 26, 17),
        "gpt-4o-2024-0806/gpt-4o-0806": (52.13, 14, 18),
        "gpt-4o-2024-0806/llama3.3-70b": (49.43, 15, 25),
        "gpt-4o-2024-0806/openai-o1": (40.81, 12, 33),
    }
    logs = read_logs([SHARED])
    assert sorted(log.name for log in logs) == sorted(expected)
    for log in logs:
        replays = [replay_with_logged_changes(d) for d in log.dialogues]
        assert all(r.matches for r in replays), log.name
        finals = [r.emotions[-1] for r in replays]
        assert (
            round(sum(finals) / len(finals), 2),
            sum(f >= 100 for f in finals),
            sum(f < 10 for f in finals),
        ) == expected[log.name]


class Counting(SimulatedUser):
    """Proposes +25 for even turns and -3 for odd ones; raises on batch ``fail_at`` (1-based)."""

    deterministic = True

    def __init__(self, fail_at=None):
        self.batches, self.fail_at, self.seeds = 0, fail_at, []

    def opening(self, personas, seeds):
        return ["" for _ in personas]

    def appraise(self, requests):
        self.batches += 1
        if self.batches == self.fail_at:
            raise SimulatorError("simulated failure")
        self.seeds += [r.seed for r in requests]
        return [Appraisal(change=25 if r.turn % 2 == 0 else -3, thoughts=f"t{r.turn}") for r in requests]

    def reply(self, requests, appraisals, emotions):
        return ["" for _ in requests]


def test_replay_report_and_files(tmp_path):
    result = replay_logs([LOGS], Counting(), out_dir=tmp_path, batch_size=50, seed=3)
    report, records = result.report, result.records
    scored = {log.name: sum(t.scored for d in log.dialogues for t in d.turns) for log in result.logs}
    assert [row["name"] for row in report["logs"]] == list(scored) and len(scored) == 7
    assert len(records) == report["turns"] == sum(scored.values()) == 180
    for row, log in zip(report["logs"], result.logs):
        board = leaderboard(log.dialogues)
        assert (row["score"], row["success"], row["failure"]) == (board["score"], board["success"], board["failure"])
        assert row["replayed_score"] == board["score"] and row["protocol_matches"] == 3
        assert row["turns"] == scored[log.name]
    first = records[0]
    assert (first["log"], first["turn"], first["emotion_before"]) == ("gemini-2.5-flash-nothink/openai-o1", 1, 40)
    assert first["predicted"] == -3 and first["proposed"] == -3
    assert records[1]["proposed"] == 25 and records[1]["predicted"] == 10  # clamped by SAGE
    assert first["seed"] == derive_seed(3, first["log"], first["dialogue_id"], 1)
    expected = agreement(
        [r["predicted"] for r in records], [r["logged_change"] for r in records], models=[r["log"] for r in records]
    )
    assert report["agreement"]["sign_agreement"] == expected.sign_agreement
    assert report["agreement"]["kendall_tau"] == expected.kendall_tau
    gpt4o = report["by_simulator"]["gpt-4o-2024-0806"]
    assert gpt4o["turns"] == 180 - scored["gemini-2.5-flash-nothink/openai-o1"] and len(gpt4o["per_model"]) == 6
    assert report["by_simulator"]["gemini-2.5-flash-nothink"]["kendall_tau"] is None  # one model
    lines = (tmp_path / "turns.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == records
    assert json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))["turns"] == 180
    assert (tmp_path / "scatter.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replay_resumes_after_a_failure_and_gives_the_same_report(tmp_path):
    clean = replay_logs([LOGS], Counting(), out_dir=tmp_path / "clean", batch_size=40)
    with pytest.raises(SimulatorError, match="simulated failure"):
        replay_logs([LOGS], Counting(fail_at=3), out_dir=tmp_path / "crashed", batch_size=40)
    assert len((tmp_path / "crashed" / "turns.jsonl").read_text().splitlines()) == 80  # two batches saved
    user = Counting()
    resumed = replay_logs([LOGS], user, out_dir=tmp_path / "crashed", batch_size=40)
    assert resumed.resumed == 80 and len(user.seeds) == 100
    assert resumed.report["agreement"] == clean.report["agreement"] and resumed.records == clean.records
    with pytest.raises(ValueError, match="another configuration"):
        replay_logs([LOGS], Counting(), out_dir=tmp_path / "crashed", seed=1)


def test_same_seed_same_requests_whatever_the_batching():
    a, b = Counting(), Counting()
    replay_logs([GPT4O], a, batch_size=7, seed=5)
    replay_logs([GPT4O], b, batch_size=100, seed=5)
    assert a.seeds == b.seeds and len(set(a.seeds)) == len(a.seeds)


def test_the_replay_command_with_the_rule_user(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["replay", str(LOGS), "--user", "rule", "--out", str(out)], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    row = next(r for r in report["logs"] if r["name"] == "gpt-4o-2024-0806/gpt-4o-0806")
    assert (row["score"], row["success"], row["failure"]) == (40 / 3, 0, 1)  # 15, 20, 5
    assert "gpt-4o-2024-0806/gpt-4o-0806" in result.stdout and "13.33" in result.stdout
    assert "sign agree" in result.stdout and "Kendall tau" in result.stdout and "3/3" in result.stdout
    assert f"{report['agreement']['sign_agreement']:.2f}" in result.stdout
    again = runner.invoke(app, ["replay", str(LOGS), "--user", "rule", "--out", str(out)], env={"COLUMNS": "220"})
    assert again.exit_code == 0 and "180 resumed" in again.stdout
    missing = runner.invoke(app, ["replay", str(tmp_path / "nope.jsonl"), "--out", str(out)])
    assert missing.exit_code == 1 and "no such log file" in missing.stderr
    assert runner.invoke(app, ["replay", str(LOGS)]).exit_code == 2  # no --out


def test_a_log_without_an_appraised_turn_is_named_before_anything_is_written(tmp_path):
    """Was: 'error: summarize_replay: no turns to summarize' (a function's name), after the
    run folder was made."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = runner.invoke(app, ["replay", str(empty), "--out", str(tmp_path / "run")])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: nothing to replay: no appraised turn in {empty} (0 dialogues)")
    assert not (tmp_path / "run").exists()
