"""Reading SAGE's released logs (tests/data/sage_logs: the first three dialogues of each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from empathy_gym.evaluation.sage_logs import SageLogError, leaderboard, log_names, parse_dialogue, read_sage_log
from empathy_gym.personas import load_personas

LOGS = Path(__file__).parent / "data" / "sage_logs"
GPT4O = LOGS / "gpt-4o-2024-0806_based_simulator" / "gpt-4o-0806_result.jsonl"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "sage"


def test_first_dialogue_turn_by_turn():
    first = read_sage_log(GPT4O)[0]
    # read off the file: 10 agent replies, emotions 40 -> ... -> 15, the 10th never appraised
    assert first.id == "d3c386e4-1b4d-4568-8abf-4d60a4fec355"
    assert first.final_emotion == 15
    assert first.emotions == (40, 45, 55, 50, 40, 35, 30, 25, 20, 15)
    assert len(first.turns) == 10
    turn = first.turns[0]
    assert (turn.turn, turn.emotion_before, turn.emotion_after, turn.proposed_change) == (1, 40, 45, 5)
    assert turn.history == (("user", "最近有些事搞得我头大，张浩那个态度，真让我摸不着头脑。"),)
    assert turn.utterance.startswith("听起来你在和张浩的互动中遇到了些挑战")
    assert turn.reply.startswith("对啊，他老是对未来的事模棱两可")
    assert turn.appraisal["change"] == 5
    last = first.turns[-1]
    assert not last.scored and last.change is None and last.reply is None
    assert last.emotion_before == 15 and len(last.history) == 19
    # the persona is the SAGE profile with the logged opening line
    assert first.persona.hidden_intention == "others_motives"
    assert first.persona.character_type == "negative"
    assert first.persona.opening_line == turn.history[0][1]


def test_leaderboard_of_the_slice():
    # finals of the three dialogues: 15, 20, 5 (the last one fell below 10)
    assert leaderboard(read_sage_log(GPT4O)) == {"score": 40 / 3, "success": 0, "failure": 1, "dialogues": 3}


def test_log_names():
    assert log_names(GPT4O) == ("gpt-4o-2024-0806", "gpt-4o-0806")


def test_every_slice_reads_and_matches_its_final_emotion():
    for path in sorted(LOGS.glob("*/*.jsonl")):
        for dialogue in read_sage_log(path):
            assert dialogue.emotions[-1] == dialogue.final_emotion, (path, dialogue.line)
            scored = [t for t in dialogue.turns if t.scored]
            assert all(t.emotion_after == t.emotion_before + t.change for t in scored)


def test_logged_personas_are_the_sage_bank():
    bank = {p.id: p for p in load_personas("sage")}
    assert len(bank) == 100
    for dialogue in read_sage_log(GPT4O):
        assert bank[dialogue.id].scenario == dialogue.persona.scenario
        assert bank[dialogue.id].opening_line == dialogue.persona.opening_line


def test_bad_lines_name_file_line_and_field(tmp_path):
    record = json.loads(GPT4O.read_text(encoding="utf-8").splitlines()[0])
    broken = dict(record, history=record["history"][:1] + [{"role": "user", "content": "?", "emotion-point": 5}])
    path = tmp_path / "x_result.jsonl"
    path.write_text(
        json.dumps(record, ensure_ascii=False) + "\n" + json.dumps(broken, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    with pytest.raises(SageLogError, match=r"x_result.jsonl:2: field 'history/1/role'"):
        read_sage_log(path)
    with pytest.raises(SageLogError, match=r"<record>:1: field 'emo_point': missing"):
        parse_dialogue({k: v for k, v in record.items() if k != "emo_point"})
    # history given as a JSON string reads the same as a list
    assert (
        parse_dialogue(dict(record, history=json.dumps(record["history"]))).emotions == parse_dialogue(record).emotions
    )


@pytest.mark.skipif(not SHARED.exists(), reason="no ../shared checkout beside the repo")
def test_full_logs_and_vendored_copies_match_shared_data():
    assert (Path(__file__).parents[1] / "envs" / "sage" / "profiles.jsonl").read_bytes() == (
        SHARED / "profiles.jsonl"
    ).read_bytes()
    for path in sorted(LOGS.glob("*/*.jsonl")):
        full = SHARED / "logs" / path.parent.name / path.name
        assert full.read_text(encoding="utf-8").splitlines()[:3] == path.read_text(encoding="utf-8").splitlines()
    # SAGE's leaderboard numbers of the GPT-4o-simulated GPT-4o run (computed from the whole file)
    board = leaderboard(read_sage_log(SHARED / "logs" / GPT4O.parent.name / GPT4O.name))
    assert (round(board["score"], 2), board["success"], board["failure"]) == (52.13, 14, 18)
