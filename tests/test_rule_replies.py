"""How the rule user's replies read (issue 10): no sentence said twice in a dialogue, no
markdown, no sentence that states the hidden need, no pronoun errors.

The checks are those of ``benchmarks/rule_user_replies.py`` (which prints the rates on
the whole ``sage`` and ``en`` banks); here they run on a slice of each bank.
"""

from __future__ import annotations

import re

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


# -- the reply never contradicts the change (issue 36) ---------------------------------------
# Hand-written markers of how a line reads. Before the fix, `play` showed the appraisal
# "Finally, someone gets what I'm after" (+2) with the reply "Seriously? That's all you've
# got?": band C's lines were all complaints, whatever the change.
DISAPPOINTED = {
    "en": re.compile(
        r"(?i)not helping|worse|seriously\?|that's all you|all you've got|that's it\?|is that all|just that\?"
        r"|not (?:really )?(?:listening|hearing)|nobody gets|not convinced|not sure you get|heard that|easy to say"
        r"|why do i even|pointless|feel stupid|don't see how|what i'm after|not quite|forget (?:it|i)|never mind"
        r"|drop it|i knew this|had enough|going nowhere|leave it|done with this|shouldn't have|brush|lecture|told off"
        r"|feels empty|sat less well|harder to hear|less sure|a bit much|doesn't (?:quite )?fit|don't know if that's it"
        r"|not sure (?:that|about)|can we not|figure it out myself|nothing seems to change|in theory|what i expected"
        r"|going on about|keep quiet|what everyone says|creepy|strange thing|letters to me|repeating me"
        r"|same (?:thing|line)"
        r"|already said|doesn't (?:really )?(?:change anything|help)|it doesn't matter\.|can't make sense|don't follow"
    ),
    "zh": re.compile(
        r"没用|更难受|没人懂|干嘛还要解释|没听明白|说了你也不懂|有什么用|越说越|就知道会这样|只会说这些|听过很多次|说起来容易"
        r"|可没觉得|没这么简单|看不出|不知道自己在期待|不确定你真的懂|心里还是堵|不太舒服|不太同意|不太认同|不太是这样|难听进去"
        r"|有点不确定|不好说|有点过了|不太对|不是这样|听不进去|有没有用|别把这事说得|你想多了|不说了|当我没提|换个话题|别管了"
        r"|不想说这个|别问了|这事就这样吧|白说|没在听|够了|不打扰|改变不了|不好意思|不重要|莫名其妙|看不懂|读不懂|重复我|说过了"
        r"|同样的话|又是这句|敷衍|小题大做|说得倒轻巧|教育我|大道理|听训|很空|解决不了|就这样？|就这些？|就一句|然后呢"
    ),
}
RELIEVED = {
    "en": re.compile(
        r"(?i)(?<!n't )\bhelps?\b|helped|helpful|better|thank|lighter|that one landed|closer|\bfair|reassuring|useful"
        r"|makes (?:some )?sense"
        r"|that's right|gentle|breathe|got it|you're right|kind of you|easier|weight off|sorted|not bad|i like that"
        r"|decent|work with that|that's more like"
    ),
    "zh": re.compile(
        r"(?<!没)有用|帮助|谢谢|轻松多了|松快|好多了|好一点|好一些|(?<!不)好受|(?<!不)(?<!不太)舒服|有道理|说到点子上|放心|踏实"
        r"|暖暖|理清|靠谱|说得对|公道|懂我|解开|不错|还好一点"
    ),
}


@pytest.mark.parametrize("language", ["en", "zh"])
def test_every_reply_template_reads_as_its_direction(language):
    """Every line the user can say after a gain reads as no complaint, after a loss as no
    relief, after no change as neither; reactions (said only after a change <= 0) are never
    relief; hints (said whatever the change) are neither."""
    data = load_rules(str(RULES_DIR))[language].data
    for band, characters in data["replies"].items():
        for character, tones in characters.items():
            for tone, lines in tones.items():
                for line in lines:
                    where = (band, character, tone, line)
                    if tone in ("up", "level"):
                        assert not DISAPPOINTED[language].search(line), where
                    if tone in ("down", "level") and band != "S":  # S: a thankful goodbye, reached by a gain
                        assert not RELIEVED[language].search(line), where
    for feature, lines in data["reactions"].items():
        assert not any(RELIEVED[language].search(line) for line in lines), feature
    for intention, lines in data["hints"].items():
        for line in lines:
            assert not DISAPPOINTED[language].search(line) and not RELIEVED[language].search(line), (intention, line)


@pytest.mark.parametrize("language", ["en", "zh"])
def test_the_reply_never_contradicts_the_change(language):
    """Replies in every band and character type, after a gain and after a loss (reactions
    and hints included: the easy difficulty hints in bands B and C), over many seeds."""
    from test_rule_user import make_persona

    user = RuleUser(difficulty="easy")
    said = 0
    for character in ("negative", "passive", "avoidant"):
        persona = make_persona(language, character=character)
        opening = user.opening([persona], [0])[0]
        for emotion in (5, 22, 55, 85, 100):
            for change in (-3, 2):
                if emotion == 100 and change < 0:
                    continue  # 100 is reached only by a gain
                for seed in range(8):
                    request = UserRequest(persona, (("user", opening),), "Okay. I see.", 40, 1 + seed % 3, seed=seed)
                    appraisal = Appraisal(change=change, features={"dismissive": -2.0, "intention": 3.0})
                    [reply] = user.reply([request], [appraisal], [emotion])
                    wrong = (DISAPPOINTED if change > 0 else RELIEVED)[language]
                    assert not wrong.search(reply), (character, emotion, change, reply)
                    said += 1
    assert said == 3 * 9 * 8


def test_a_rules_file_with_replies_not_split_by_direction_is_refused(tmp_path):
    import json
    import shutil

    for code in ("en", "zh"):
        shutil.copyfile(RULES_DIR / f"{code}.json", tmp_path / f"{code}.json")
    data = json.loads((tmp_path / "en.json").read_text(encoding="utf-8"))
    data["replies"]["B"]["negative"] = data["replies"]["B"]["negative"]["level"]  # the format before issue 36
    (tmp_path / "en.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=r"en.json: field 'replies/B/negative/up': expected a non-empty list"):
        RuleUser(rules_dir=tmp_path)
