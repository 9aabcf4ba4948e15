import collections
import hashlib
import json
from pathlib import Path

import pytest

from empathy_gym.personas import (
    INTENTIONS,
    Persona,
    PersonaError,
    load_personas,
    load_personas_file,
    persona_from_dict,
    persona_from_rlver,
)
from empathy_gym.resources import envs_dir

SHARED_RLVER = Path(__file__).resolve().parents[2] / "shared" / "data" / "rlver" / "train_profile.jsonl"
GOOD = {
    "id": "p1",
    "language": "en",
    "profile": "Ana, 30, nurse. Speaks fast.",
    "scenario": "Ana was blamed for a colleague's mistake.",
    "hidden_intention": "not_at_fault",
    "character_type": "negative",
    "traits": ["proud", "tired"],
}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def test_all_500_rlver_profiles_load_and_map_to_standard_ids():
    personas = load_personas("rlver")
    assert len(personas) == 500
    # Counts from the data's README (envs/rlver/README.md).
    assert collections.Counter(p.hidden_intention for p in personas) == {
        "not_at_fault": 66,
        "guided_reflection": 66,
        "dialectical_analysis": 66,
        "deep_empathy": 64,
        "venting_listened": 63,
        "others_motives": 60,
        "practical_advice": 58,
        "specific_praise": 57,
    }
    assert collections.Counter(p.character_type for p in personas) == {"negative": 183, "passive": 174, "avoidant": 143}
    assert all(p.language == "zh" and len(p.traits) == 3 and p.opening_line is None for p in personas)
    assert all("####隐藏主题" not in p.scenario and p.intention_text() not in p.scenario for p in personas)
    first = personas[0]
    assert first.id == "6186ad54-5996-4b91-9402-6a5e4c2ae9ad"
    assert (first.name, first.hidden_intention, first.character_type) == ("王丽娜", "practical_advice", "passive")
    assert first.traits == ("内向", "谦逊", "愤懑")


@pytest.mark.skipif(not SHARED_RLVER.exists(), reason="no ../shared checkout beside the repo")
def test_vendored_rlver_copy_matches_shared_data():
    vendored = envs_dir() / "rlver" / "train_profile.jsonl"
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()
    assert digest(vendored) == digest(SHARED_RLVER)


def test_sage_first_talk_becomes_opening_line():
    record = json.loads((envs_dir() / "rlver" / "train_profile.jsonl").open(encoding="utf-8").readline())
    record["first_talk"] = "  我最近睡不好。 "
    assert persona_from_rlver(record).opening_line == "我最近睡不好。"


def test_unknown_task_is_kept_as_free_text(tmp_path):
    record = json.loads((envs_dir() / "rlver" / "train_profile.jsonl").open(encoding="utf-8").readline())
    record["task"] = "你希望对方陪你聊聊天"
    persona = persona_from_rlver(record)
    assert persona.hidden_intention == "你希望对方陪你聊聊天"
    assert not persona.intention_is_standard
    assert persona.intention_text() == "你希望对方陪你聊聊天"


def test_rlver_bad_character_label_names_file_line_field(tmp_path):
    record = json.loads((envs_dir() / "rlver" / "train_profile.jsonl").open(encoding="utf-8").readline())
    bad = dict(record, id="x2", main_cha="开朗型")
    path = write_jsonl(tmp_path / "bank.jsonl", [record, bad])
    with pytest.raises(PersonaError) as info:
        load_personas_file(path)
    assert info.value.line == 2 and info.value.field == "main_cha"
    assert f"{path.resolve()}:2: field 'main_cha'" in str(info.value)


def test_rlver_missing_field_is_named(tmp_path):
    record = json.loads((envs_dir() / "rlver" / "train_profile.jsonl").open(encoding="utf-8").readline())
    del record["task"]
    path = write_jsonl(tmp_path / "bank.jsonl", [record])
    with pytest.raises(PersonaError, match=r":1: field 'task': 'task' is a required property"):
        load_personas_file(path)


def test_our_format_round_trip(tmp_path):
    path = write_jsonl(tmp_path / "bank.jsonl", [GOOD, dict(GOOD, id="p2", opening_line="Hey.")])
    personas = load_personas(str(path))
    assert personas[0] == Persona(**dict(GOOD, traits=("proud", "tired")))
    assert personas[1].opening_line == "Hey."
    assert personas[0].intention_text() == INTENTIONS["not_at_fault"][0]
    assert personas[0].intention_text("zh") == INTENTIONS["not_at_fault"][1]


@pytest.mark.parametrize(
    "change,field,message",
    [
        ({"character_type": "cheerful"}, "character_type", "is not one of"),
        ({"language": "fr"}, "language", "is not one of"),
        ({"initial_emotion": 140}, "initial_emotion", "140 is greater than the maximum of 100"),
        ({"traits": "proud"}, "traits", "is not of type 'array'"),
        ({"topic": "work"}, "topic", "Additional properties are not allowed"),
        ({"profile": ""}, "profile", "does not match"),
        ({"opening_line": "   "}, "opening_line", "does not match"),
    ],
)
def test_schema_errors_name_file_line_field(tmp_path, change, field, message):
    path = write_jsonl(tmp_path / "bank.jsonl", [GOOD, dict(GOOD, id="p2"), dict(GOOD, id="p3", **change)])
    with pytest.raises(PersonaError) as info:
        load_personas_file(path)
    assert (info.value.line, info.value.field) == (3, field)
    assert str(info.value).startswith(f"{path.resolve()}:3: field '{field}': ")
    assert message in str(info.value)


def test_missing_required_field(tmp_path):
    record = dict(GOOD)
    del record["hidden_intention"]
    path = write_jsonl(tmp_path / "bank.jsonl", [record])
    with pytest.raises(PersonaError, match=r":1: field 'hidden_intention': 'hidden_intention' is a required"):
        load_personas_file(path)


def test_bad_json_line(tmp_path):
    path = tmp_path / "bank.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n{oops\n", encoding="utf-8")
    with pytest.raises(PersonaError, match=r"bank.jsonl:3: not valid JSON"):
        load_personas_file(path)
    # a line cut short: the column is where it ends (38 characters), not 1 on the "line" after its newline
    path.write_text(json.dumps(GOOD) + '\n{"id": "clinic-03", "language": "en", \n', encoding="utf-8")
    with pytest.raises(PersonaError, match=r"bank.jsonl:2: not valid JSON: .* \(column 39\)"):
        load_personas_file(path)


def test_a_line_that_is_not_utf8(tmp_path):
    path = tmp_path / "bank.jsonl"
    latin1 = json.dumps({**GOOD, "id": "p2", "profile": "Zoé"}, ensure_ascii=False).encode("latin-1")
    path.write_bytes(json.dumps(GOOD).encode() + b"\n" + latin1 + b"\n")
    column = latin1.index(b"\xe9") + 1
    with pytest.raises(PersonaError, match=rf"bank.jsonl:2: not valid UTF-8 \(byte 0xe9 at column {column}\)"):
        load_personas_file(path)


def test_a_utf8_file_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "bank.jsonl"
    path.write_text(json.dumps(GOOD) + "\n", encoding="utf-8-sig")  # was refused: "Unexpected UTF-8 BOM"
    assert [p.id for p in load_personas_file(path)] == [GOOD["id"]]


def test_duplicate_id(tmp_path):
    path = write_jsonl(tmp_path / "bank.jsonl", [GOOD, GOOD])
    with pytest.raises(PersonaError, match=r":2: field 'id': duplicate persona id 'p1' \(first on line 1\)"):
        load_personas_file(path)


def test_empty_file(tmp_path):
    path = tmp_path / "bank.jsonl"
    path.write_text("\n", encoding="utf-8")
    with pytest.raises(PersonaError, match="holds no personas"):
        load_personas_file(path)


def test_list_input_reports_index():
    with pytest.raises(PersonaError, match=r"<list>:2: field 'character_type'"):
        load_personas([GOOD, dict(GOOD, id="p2", character_type="x")])
    with pytest.raises(PersonaError, match=r"<list>:1: expected a Persona or a dict, got int"):
        load_personas([3])


def test_edited_file_is_reloaded(tmp_path):
    path = write_jsonl(tmp_path / "bank.jsonl", [GOOD])
    assert len(load_personas_file(path)) == 1
    import os
    import time

    write_jsonl(path, [GOOD, dict(GOOD, id="p2")])
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert len(load_personas_file(path)) == 2


def test_an_unknown_bank_name_lists_the_built_in_ones():
    with pytest.raises(
        FileNotFoundError,
        match=r"no persona bank 'nosuch': not a file, and not a built-in "
        r"bank \(en, zh, adversarial, rlver, sage, rlver_minus_sage\)",
    ):
        load_personas("nosuch")


# -- issue 10: values the schema lets through but the rest of the package cannot use ----


def test_initial_emotion_float_is_converted_exactly_and_renders(tmp_path):
    import gymnasium as gym

    import empathy_gym  # noqa: F401  (registers the env ids)

    path = write_jsonl(tmp_path / "bank.jsonl", [dict(GOOD, initial_emotion=40.0)])
    (persona,) = load_personas_file(path)
    assert persona.initial_emotion == 40 and type(persona.initial_emotion) is int
    assert Persona(**dict(GOOD, traits=(), initial_emotion=35.0)).initial_emotion == 35
    env = gym.make("EmpathyDialogue-v0", personas=[dict(GOOD, initial_emotion=40.0)], render_mode="ansi")
    env.reset(seed=0)
    assert " 40/100" in env.render()  # used to raise "Unknown format code 'd' for object of type 'float'"


@pytest.mark.parametrize("value", [40.5, True, "40"])
def test_initial_emotion_that_is_not_an_integer_is_refused(tmp_path, value):
    path = write_jsonl(tmp_path / "bank.jsonl", [GOOD, dict(GOOD, id="p2", initial_emotion=value)])
    with pytest.raises(PersonaError) as info:
        load_personas_file(path)
    assert (info.value.line, info.value.field) == (2, "initial_emotion")
    with pytest.raises(PersonaError, match="initial_emotion"):
        Persona(**dict(GOOD, traits=(), initial_emotion=value))


@pytest.mark.parametrize(
    "typo", ["deep_empathyy", "Deep_Empathy", " deep_empathy", "deep empathy", "deep-empathy", "DEEP_EMPATHY "]
)
def test_a_near_miss_of_a_standard_intention_is_refused_with_did_you_mean(tmp_path, typo):
    path = write_jsonl(tmp_path / "bank.jsonl", [GOOD, dict(GOOD, id="p2", hidden_intention=typo)])
    with pytest.raises(PersonaError, match=r"did you mean 'deep_empathy'\?") as info:
        load_personas_file(path)
    assert (info.value.line, info.value.field) == (2, "hidden_intention")
    assert "free-text intention is a sentence" in str(info.value)
    with pytest.raises(PersonaError, match="did you mean"):
        Persona(**dict(GOOD, traits=(), hidden_intention=typo))


def test_free_text_intentions_that_are_sentences_still_load(tmp_path):
    texts = ["wants someone to notice the extra shifts she covered", "wants deep empathy, not advice", "reassurance"]
    path = write_jsonl(
        tmp_path / "bank.jsonl", [dict(GOOD, id=f"p{i}", hidden_intention=text) for i, text in enumerate(texts)]
    )
    assert [p.hidden_intention for p in load_personas_file(path)] == texts


def test_rlver_near_miss_of_a_task_label_is_refused(tmp_path):
    record = json.loads((envs_dir() / "rlver" / "train_profile.jsonl").open(encoding="utf-8").readline())
    typo = dict(record, task=INTENTIONS["deep_empathy"][1] + "。")
    path = write_jsonl(tmp_path / "bank.jsonl", [record, dict(typo, id="x2")])
    with pytest.raises(PersonaError, match="did you mean 'deep_empathy'") as info:
        load_personas_file(path)
    assert (info.value.line, info.value.field) == (2, "task")


def test_a_misspelt_key_is_named_next_to_the_missing_one():
    record = {
        "id": "x",
        "language": "en",
        "profile": "p",
        "scenario": "s",
        "hidden_intention": "deep_empathy",
        "charcter_type": "negative",
    }
    with pytest.raises(
        PersonaError,
        match=r"f\.jsonl:3: field 'character_type': .*required.*"
        r"the record has 'charcter_type': a misspelling\?",
    ):
        persona_from_dict(record, path="f.jsonl", line=3)
