"""Re-judging our own dialogues: ``eval``'s transcripts.jsonl and training's episodes.jsonl
read as logged dialogues, re-appraised by another user, agreement per turn and per
dialogue."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from empathy_gym.cli import app
from empathy_gym.evaluation.benchmark import evaluate
from empathy_gym.evaluation.own_logs import read_own_log
from empathy_gym.evaluation.replay import replay_logs
from empathy_gym.evaluation.sage_logs import SageLogError
from empathy_gym.personas import load_personas
from empathy_gym.user.scripted import ScriptedUser

EN = load_personas("en")


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "listener"
    evaluate("baseline:listener", "en", user="rule", limit=4, out_dir=out)
    return out


def test_the_user_that_played_a_run_agrees_with_itself_exactly(eval_run):
    # the rule user's appraisal depends on the text only: re-judged, every turn gets the
    # change it got while the dialogue was played, and the protocol replays every dialogue
    result = replay_logs([eval_run], "rule")
    transcripts = [json.loads(line) for line in (eval_run / "transcripts.jsonl").read_text().splitlines()]
    assert [r["logged_change"] for r in result.records] == [
        s["applied_change"] for t in transcripts for s in t["steps"]
    ]
    assert result.report["agreement"]["mae"] == 0.0 and result.report["agreement"]["sign_agreement"] == 1.0
    assert result.report["dialogue_agreement"]["turns"] == 4 and result.report["dialogue_agreement"]["mae"] == 0.0
    assert result.report["logs"][0]["name"] == "rule/listener"
    assert result.report["logs"][0]["protocol_matches"] == 4


def test_another_judge_is_compared_turn_by_turn_and_dialogue_by_dialogue(eval_run):
    result = replay_logs([eval_run], ScriptedUser([+5]))  # a judge that always says +5
    logged = [r["logged_change"] for r in result.records]
    assert {r["predicted"] for r in result.records} == {5}
    assert result.report["agreement"]["mae"] == pytest.approx(np.mean([abs(5 - change) for change in logged]))
    by_dialogue: dict[str, list[int]] = {}
    for record in result.records:
        by_dialogue.setdefault(record["dialogue_id"], []).append(record["logged_change"])
    expected = np.mean([abs(5 * len(changes) - sum(changes)) for changes in by_dialogue.values()])
    assert result.report["dialogue_agreement"]["mae"] == pytest.approx(expected)


def test_training_episodes_give_replies_without_thinking(tmp_path):
    persona = EN[0]
    record = {
        "step": 3,
        "persona_id": persona.id,
        "emotions": [50, 55, 52],
        "rewards": [0.05, -0.03],
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "opening"},
            {"role": "assistant", "content": "<think>she is hurt</think> That sounds hard."},
            {"role": "user", "content": "It is."},
            {"role": "assistant", "content": "Tell me more."},
        ],
    }
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps(record) + "\n" + json.dumps(record) + "\n")
    first, second = read_own_log(path, "en")
    assert [t.utterance for t in first.turns] == ["That sounds hard.", "Tell me more."]
    assert [(t.emotion_before, t.emotion_after, t.proposed_change) for t in first.turns] == [
        (50, 55, None),
        (55, 52, None),
    ]
    assert first.turns[1].history == (("user", "opening"), ("agent", "That sounds hard."), ("user", "It is."))
    assert (first.id, second.id) == (f"{persona.id}@1", f"{persona.id}@2")  # one persona, two dialogues


def test_own_logs_refuse_an_unknown_persona_and_a_missing_bank(tmp_path):
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps({"persona_id": "nobody", "emotions": [50], "messages": []}) + "\n")
    with pytest.raises(SageLogError, match="no run.json"):
        read_own_log(path)
    with pytest.raises(SageLogError, match=r"episodes.jsonl:1: field 'persona_id': 'nobody'"):
        read_own_log(path, "en")
    path.write_text(json.dumps({"persona_id": EN[0].id, "emotions": [], "messages": []}) + "\n")
    with pytest.raises(SageLogError, match=r"episodes.jsonl:1: field 'emotions': expected a non-empty list"):
        read_own_log(path, "en")


def test_the_replay_command_re_judges_an_eval_run(eval_run, tmp_path):
    result = CliRunner().invoke(
        app, ["replay", str(eval_run), "--user", "rule,difficulty=challenging", "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 0, result.output
    assert "rule/listener" in result.output and "per dialogue" in result.output
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["agreement"]["mae"] > 0  # another difficulty is another judge
