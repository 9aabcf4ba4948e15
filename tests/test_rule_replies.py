"""How the rule user's replies read (issue 10): no sentence said twice in a dialogue, no
markdown, no sentence that states the hidden need, no pronoun errors.

The checks are those of ``benchmarks/rule_user_replies.py`` (which prints the rates on
the whole ``sage`` and ``en`` banks); here they run on a slice of each bank.
"""

from __future__ import annotations

import pytest
from script_modules import ROOT, load_script

from empathy_gym.evaluation.benchmark import evaluate
from empathy_gym.personas import load_personas
from empathy_gym.user.base import Appraisal, UserRequest
from empathy_gym.user.rule_lexicon import RULES_DIR, load_rules
from empathy_gym.user.rule_story import persona_story
from empathy_gym.user.rule_user import RuleUser, sentences_of


def _benchmark():
    return load_script(ROOT / "benchmarks" / "rule_user_replies.py")


@pytest.mark.parametrize("bank", ["sage", "en"])
@pytest.mark.parametrize("policy", ["baseline:listener", "baseline:esconv"])
def test_replies_on_a_slice_of_each_bank(bank, policy):
    # Before issue 10 (same slice): about 1,000 (sage) and 1,700 (en) repeated sentences per
    # 1,000 turns, markdown fragments and stated needs in Chinese, pronoun errors in English.
    benchmark = _benchmark()
    personas = {p.id: p for p in load_personas(bank)}
    result = evaluate(policy, bank, user=RuleUser(), limit=16, n_resamples=10)
    rates = benchmark.measure(result.records, personas)
    assert rates["turns"] > 100
    assert rates["repeated"] < 100, rates
    assert rates["markdown"] == 0 and rates["need"] == 0 and rates["pronoun"] == 0, rates


def _story(bank: str, persona_id: str):
    persona = next(p for p in load_personas(bank) if p.id == persona_id)
    return persona, persona_story(persona, load_rules(str(RULES_DIR))[persona.language])


def test_english_rewriting_cases_from_the_issue():
    _, hannah = _story("en", "en-012-mocking-tiktok")
    told = " ".join(hannah.details + (hannah.state,))
    assert "Six weeks ago I posted" in told and " me posted" not in told
    _, ravi = _story("en", "en-011-cofounder-left")
    told = " ".join(ravi.details + (ravi.state,))
    # "writing in his farewell email that Ravi 'hasn't really listened'": his is Arjun's
    assert "my farewell email" not in told and "I 'hasn't" not in told and "Ravi" not in told
    _, mei_lin = _story("en", "en-003-grandson-wrist")  # "Tan Mei Lin": family name first
    assert not any("Mei Lin" in sentence for sentence in mei_lin.details)


def test_chinese_details_have_no_markdown_third_person_or_need():
    persona, story = _story("sage", "66aaf749-a759-4048-9915-a02753fcbeae")
    told = "".join(story.details)
    assert "事件发生之初" not in told and "（3年前）" not in told and "1." not in told
    assert "他" not in told.replace("他们", "") and "时间线" not in told
    for persona in load_personas("sage")[:30]:
        story = persona_story(persona, load_rules(str(RULES_DIR))["zh"])
        for sentence in story.details:
            assert persona.name not in sentence and "**" not in sentence, sentence


def test_hints_hint_and_do_not_state_the_need():
    benchmark = _benchmark()
    for code in ("zh", "en"):
        hints = load_rules(str(RULES_DIR))[code].data["hints"]
        assert "我最想不通的，是他们为什么要这么做。" not in hints["others_motives"]
        for persona in load_personas("sage" if code == "zh" else "en"):
            for hint in hints[persona.hidden_intention]:
                assert not benchmark.states_need(hint, persona), (persona.hidden_intention, hint)


def test_a_user_never_repeats_itself_while_it_has_something_new_to_say():
    user = RuleUser("moderate")
    persona = load_personas("rlver")[3]
    (opening,) = user.opening([persona], [0])
    history, said = (("user", opening),), set(sentences_of("zh", opening))
    for turn in range(1, 9):
        request = UserRequest(persona, history, "嗯。", 55, turn, seed=turn)
        (reply,) = user.reply([request], [Appraisal(change=0)], [55])  # band B every turn
        new = sentences_of("zh", reply)
        assert reply and not said & set(new), (turn, reply)
        said.update(new)
        history += (("agent", "嗯。"), ("user", reply))
