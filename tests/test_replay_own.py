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


def test_a_training_run_is_named_by_its_user_and_says_why_dialogues_were_not_replayed(tmp_path):
    # Issue 37: `replay runs/smollm2-cpu-grpo` named the log "played/smollm2-cpu-grpo" and said
    # "replayed 0/240" with no reason: the run's 1-turn dialogues against the 9-turn protocol.
    import gymnasium as gym

    from empathy_gym.personas import write_personas

    run = tmp_path / "grpo-run"
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    config = {"env": {"id": "EmpathyDialogue-v0", "kwargs": {"max_turns": 1, "user": "rule"}}}
    (run / "checkpoints" / "step-000002" / "state.json").write_text(json.dumps({"step": 2, "config": config}))
    write_personas(EN[:3], run / "personas.jsonl")
    env = gym.make("EmpathyDialogue-v0", personas=list(EN[:3]), max_turns=1)
    records = []
    for seed in range(3):
        env.reset(seed=seed)
        _, _, _, truncated, info = env.step("That sounds hard. What happened?")
        assert truncated
        emotions = [info["emotion"] - info["emotion_change"], info["emotion"]]
        record = {"step": 1, "persona_id": info["persona_id"], "emotions": emotions, "messages": info["messages"]}
        records.append(record)
    (run / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    result = CliRunner().invoke(app, ["replay", str(run), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    [log] = report["logs"]
    assert log["name"] == "rule/grpo-run"
    assert log["protocol_matches"] == 0 and log["turns"] == 3
    assert log["protocol_mismatches"] == {"the log ends before the protocol ends the dialogue": 3}
    assert "3 of 3 dialogues not replayed: the log ends before the protocol ends the dialogue" in result.output
    assert "--max-turns" in result.output

    again = CliRunner().invoke(app, ["replay", str(run), "--max-turns", "1", "--out", str(tmp_path / "r1")])
    assert again.exit_code == 0, again.output
    [log] = json.loads((tmp_path / "r1" / "report.json").read_text())["logs"]
    assert log["protocol_matches"] == 3 and log["protocol_mismatches"] == {}
    assert "not replayed" not in again.output
