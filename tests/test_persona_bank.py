"""The shipped persona banks (envs/personas/en.jsonl and zh.jsonl): they load, they
cover every hidden intention and character type, and they never state the hidden need.

The counts below are literals on purpose: editing a bank should mean editing them too.
"""

from __future__ import annotations

from collections import Counter

import pytest

from empathy_gym.personas import CHARACTER_TYPES, INTENTIONS, load_personas

EN_SIZE = 48
ZH_SIZE = 8
EN_WITHOUT_OPENING = 6
ZH_WITHOUT_OPENING = 2


@pytest.fixture(scope="module")
def en():
    return load_personas("en")


@pytest.fixture(scope="module")
def zh():
    return load_personas("zh")


def test_banks_load(en, zh):
    assert len(en) == EN_SIZE
    assert len(zh) == ZH_SIZE
    both = load_personas(None)
    assert len(both) == EN_SIZE + ZH_SIZE
    assert [p.id for p in both] == [p.id for p in en] + [p.id for p in zh]


def test_language_matches_bank(en, zh):
    assert {p.language for p in en} == {"en"}
    assert {p.language for p in zh} == {"zh"}
    assert all(p.id.startswith("en-") for p in en)
    assert all(p.id.startswith("zh-") for p in zh)


def test_ids_unique_across_banks():
    ids = [p.id for p in load_personas(None)]
    assert len(ids) == len(set(ids)) == EN_SIZE + ZH_SIZE


def test_english_covers_every_intention_and_type_twice(en):
    pairs = Counter((p.hidden_intention, p.character_type) for p in en)
    assert set(pairs) <= {(i, c) for i in INTENTIONS for c in CHARACTER_TYPES}
    for intention in INTENTIONS:
        for character in CHARACTER_TYPES:
            assert pairs[(intention, character)] >= 2, (intention, character)
    # As written: exactly 2 per pair, so 6 per intention and 16 per character type.
    assert set(pairs.values()) == {2}
    assert Counter(p.hidden_intention for p in en) == {i: 6 for i in INTENTIONS}
    assert Counter(p.character_type for p in en) == {c: 16 for c in CHARACTER_TYPES}


def test_chinese_covers_every_intention_and_type(zh):
    assert Counter(p.hidden_intention for p in zh) == {i: 1 for i in INTENTIONS}
    assert Counter(p.character_type for p in zh) == {"negative": 3, "passive": 2, "avoidant": 3}


def test_all_intentions_are_standard():
    assert all(p.intention_is_standard for p in load_personas(None))


@pytest.mark.parametrize("bank", ["en", "zh"])
def test_hidden_intention_is_never_stated(bank):
    sentences = [text.lower() for pair in INTENTIONS.values() for text in pair]
    for persona in load_personas(bank):
        for field in ("scenario", "opening_line", "profile"):
            text = (getattr(persona, field) or "").lower()
            for sentence in sentences:
                assert sentence not in text, (persona.id, field, sentence)


def test_personas_without_opening_line(en, zh):
    assert sum(p.opening_line is None for p in en) == EN_WITHOUT_OPENING
    assert sum(p.opening_line is None for p in zh) == ZH_WITHOUT_OPENING
    for persona in en + zh:
        if persona.opening_line is not None:
            assert persona.opening_line.strip() == persona.opening_line != ""


def test_fields_are_filled(en, zh):
    for persona in en + zh:
        assert persona.name, persona.id
        assert 2 <= len(persona.traits) <= 4, persona.id
        assert persona.profile.strip() and persona.scenario.strip(), persona.id


def test_initial_emotion_is_rare_and_in_range():
    given = {p.id: p.initial_emotion for p in load_personas(None) if p.initial_emotion is not None}
    assert given == {"en-022-wife-memory-care": 30, "en-037-rent-increase": 40, "zh-004-widow-grief": 35}


def test_the_sage_bank_and_the_rlver_bank_without_sages_players():
    sage, rlver, clean = load_personas("sage"), load_personas("rlver"), load_personas("rlver_minus_sage")
    assert (len(sage), len(rlver), len(clean)) == (100, 500, 429)
    shared = {p.profile for p in sage} & {p.profile for p in rlver}
    # 47 player texts occur in both banks: in 54 SAGE profiles and 71 RLVER profiles
    assert len(shared) == 47
    assert sum(p.profile in shared for p in sage) == 54 and sum(p.profile in shared for p in rlver) == 71
    assert not shared & {p.profile for p in clean}
    assert [p.id for p in clean] == [p.id for p in rlver if p.profile not in shared]  # order kept
    assert all(p.opening_line for p in sage)  # SAGE's first_talk
