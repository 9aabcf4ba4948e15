"""benchmarks/env_overhead.py measures the rule user on utterances it has not scanned;
benchmarks/rule_user_parts.py times the parts of its step."""

from __future__ import annotations

import gymnasium as gym
from script_modules import ROOT, load_script

import empathy_gym  # noqa: F401  (registers the ids)


def test_each_measurement_starts_with_no_text_scanned():
    # Before: the scans live with the compiled lexicons, which load_rules keeps for the
    # process, so the 2nd and 3rd of the benchmark's best-of-3 runs found every "unseen"
    # utterance scanned already (en read 3,453 steps/s; 2,049 with the caches emptied).
    benchmark = load_script(ROOT / "benchmarks" / "env_overhead.py")
    text = "A reply that no other test sends, about the meeting on Tuesday."
    env = gym.make("EmpathyDialogue-v0", personas="en")
    env.reset(seed=0)
    env.step(text)
    assert text in env.unwrapped.user._languages["en"]._scans
    benchmark.forget_texts()
    fresh = gym.make("EmpathyDialogue-v0", personas="en")
    assert text not in fresh.unwrapped.user._languages["en"]._scans


def test_rule_user_parts_empty_lexicon_keeps_the_walk_and_matches_nothing():
    benchmark = load_script(ROOT / "benchmarks" / "rule_user_parts.py")
    from empathy_gym.user.rule_lexicon import RULES_DIR, load_rules

    validation = load_rules(str(RULES_DIR))["en"].patterns["validation"]
    empty = benchmark.empty_lexicon(validation)
    text = "that sounds really hard. i hear you."
    assert validation.findall(text) == ["that sounds really hard", "i hear you"]
    assert empty.findall(text) == []
    assert empty.pattern.startswith("(?<![a-z0-9])(?:(?!x)x)(?:(?<![a-z0-9])|(?![a-z0-9]))")
    assert validation.pattern.endswith("(?:(?<![a-z0-9])|(?![a-z0-9]))")
