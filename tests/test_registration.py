import json

import gymnasium as gym
import pytest

import empathy_gym
from empathy_gym.personas import PersonaError
from empathy_gym.resources import envs_dir
from empathy_gym.user.scripted import ScriptedUser

GOOD = {
    "id": "c1",
    "language": "en",
    "profile": "Maya, 34, ER nurse.",
    "scenario": "Maya was blamed.",
    "hidden_intention": "not_at_fault",
    "character_type": "negative",
    "opening_line": "So it's my fault now.",
}


@pytest.fixture(autouse=True)
def forget_registered_envs():
    """Unregister what a test registered: the CLI's tests list the registry, and saw the
    ids left by these tests when both ran in one process."""
    before = set(gym.envs.registry)
    yield
    for env_id in set(gym.envs.registry) - before:
        del gym.envs.registry[env_id]


def test_builtin_ids_registered_on_import():
    for env_id, difficulty in [
        ("EmpathyDialogue-v0", "moderate"),
        ("EmpathyDialogue-Hard-v0", "challenging"),
        ("EmpathyDialogue-Easy-v0", "easy"),
        ("EmpathyDialogue-RLVER-v0", "moderate"),
    ]:
        spec = gym.spec(env_id)
        assert spec.kwargs["difficulty"] == difficulty and spec.nondeterministic is False


def test_register_from_a_path_and_make(tmp_path):
    path = tmp_path / "clinic.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(dict(GOOD, id="c2")) + "\n")
    spec = empathy_gym.register_persona_env(
        "Clinic-Hard-v0", personas=path, difficulty="challenging", max_turns=3, override=True
    )
    assert spec.kwargs["personas"] == str(path) and spec.kwargs["max_turns"] == 3
    env = gym.make("Clinic-Hard-v0", user=ScriptedUser([1]))
    obs, info = env.reset(seed=0)
    assert obs == "So it's my fault now." and info["persona_id"] in {"c1", "c2"}
    assert env.unwrapped.difficulty.name == "challenging" and env.unwrapped.protocol.max_turns == 3


def test_relative_paths_registered_in_one_folder_are_found_from_another(tmp_path, monkeypatch):
    """Was: FileNotFoundError at gym.make after a chdir (the relative path was kept)."""
    (tmp_path / "clinic.jsonl").write_text(json.dumps(GOOD) + "\n")
    preset = json.loads((envs_dir() / "difficulty" / "challenging.json").read_text())
    (tmp_path / "hard.json").write_text(json.dumps({**preset, "name": "hard-clinic"}))
    monkeypatch.chdir(tmp_path)
    spec = empathy_gym.register_persona_env(
        "ClinicRel-v0", personas="clinic.jsonl", difficulty="hard.json", override=True
    )
    assert spec.kwargs["personas"] == str(tmp_path / "clinic.jsonl")
    monkeypatch.chdir(tmp_path.parent)
    env = gym.make("ClinicRel-v0").unwrapped
    assert [p.id for p in env.personas] == ["c1"] and env.difficulty.name == "hard-clinic"
    assert empathy_gym.register_persona_env("EnRel-v0", personas="en", override=True).kwargs["personas"] == "en"


def test_register_from_a_list_keeps_validated_personas():
    spec = empathy_gym.register_persona_env("ClinicList-v0", personas=[GOOD], override=True)
    assert spec.kwargs["personas"][0].id == "c1"
    assert gym.make("ClinicList-v0").unwrapped.personas[0].opening_line == "So it's my fault now."


def test_bad_bank_fails_at_registration(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(dict(GOOD, id="c2", character_type="cheerful")) + "\n")
    with pytest.raises(PersonaError, match=r"bad.jsonl:2: field 'character_type'"):
        empathy_gym.register_persona_env("Bad-v0", personas=path)
    assert "Bad-v0" not in gym.registry


def test_bad_difficulty_fails_at_registration():
    with pytest.raises(KeyError, match="unknown difficulty 'brutal'"):
        empathy_gym.register_persona_env("Brutal-v0", personas=[GOOD], difficulty="brutal")
    with pytest.raises(ValueError, match=r"field 'rule/gain_scale'"):
        empathy_gym.register_persona_env(
            "Brutal-v0",
            personas=[GOOD],
            difficulty={"name": "x", "description": "", "prompt": {"en": "", "zh": ""}, "rule": {"gain_scale": -1}},
        )


@pytest.mark.parametrize(
    "kwargs,message",
    [({"max_turns": -1}, "max_turns"), ({"reward_mode": "x"}, "reward_mode"), ({"think": "y"}, "think")],
)
def test_the_envs_other_keywords_fail_at_registration(kwargs, message):
    """Was: registered, and refused only at the first gym.make."""
    with pytest.raises((TypeError, ValueError), match=message):
        empathy_gym.register_persona_env("BadKeyword-v0", personas=[GOOD], **kwargs)
    assert "BadKeyword-v0" not in gym.registry


def test_an_id_cannot_default_to_the_user_on_the_policys_weights():
    """Was accepted: the id then failed at every gym.make, and a recipe naming it without
    env.kwargs.user trained with no user the trainer could build."""
    with pytest.raises(ValueError, match=r"user backend 'policy' is built only by a trainer, from its policy; "):
        empathy_gym.register_persona_env("OnPolicy-v0", personas=[GOOD], user="policy")
    assert "OnPolicy-v0" not in gym.registry


def test_every_difficulty_field_is_described_in_the_schema_and_the_docs():
    # Issue 37: what gain_scale, loss_scale, intention_required and hint_below_band mean was
    # written nowhere a user of docs/personas.md would look.
    from pathlib import Path

    from empathy_gym.user.difficulty import DIFFICULTY_SCHEMA

    docs = (Path(__file__).parents[1] / "docs" / "personas.md").read_text(encoding="utf-8")
    fields = []
    for name, spec in DIFFICULTY_SCHEMA["properties"].items():
        assert spec.get("description"), name
        nested = spec.get("properties", {})
        fields += [f"{name}.{inner}" for inner in nested] if name == "rule" else [name]
        for inner, inner_spec in nested.items():
            assert name == "prompt" or inner_spec.get("description"), f"{name}.{inner}"
    for field in fields:
        assert f"| `{field}`" in docs or (field == "prompt" and "| `prompt.en`" in docs), field


def test_duplicate_id_needs_override():
    empathy_gym.register_persona_env("Dup-v0", personas=[GOOD], override=True)
    with pytest.raises(gym.error.Error, match="already registered"):
        empathy_gym.register_persona_env("Dup-v0", personas=[GOOD])


def test_llm_backed_id_is_nondeterministic():
    spec = empathy_gym.register_persona_env(
        "ClinicLLM-v0", personas=[GOOD], user="openai:m@http://127.0.0.1:9/v1", override=True
    )
    assert spec.nondeterministic is True
