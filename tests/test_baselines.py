"""The baseline agents' outputs, worked out from their templates."""

from empathy_gym.evaluation.baselines import BASELINES, EchoAgent, ESConvAgent, GenericComfortAgent, ListenerAgent
from empathy_gym.evaluation.policies import make_policy

EN = [
    {"role": "system", "content": "You are a warm listener."},
    {"role": "user", "content": "My boss blamed me for the delay. I did nothing wrong."},
]
ZH = [
    {"role": "system", "content": "你是一位温暖的倾听者。"},
    {"role": "user", "content": "领导当着大家的面批评了我。我觉得很委屈。"},
]


def test_generic_and_echo():
    assert GenericComfortAgent()(EN) == GenericComfortAgent.EN
    assert GenericComfortAgent()(ZH) == GenericComfortAgent.ZH
    assert EchoAgent()(EN) == "It sounds like you're saying: My boss blamed me for the delay."
    assert EchoAgent()(ZH) == "你是说，领导当着大家的面批评了我。"


def test_language_comes_from_the_system_prompt_not_the_latest_reply():
    mixed = EN + [{"role": "assistant", "content": "Tell me more."}, {"role": "user", "content": "他说我错了"}]
    assert GenericComfortAgent()(mixed) == GenericComfortAgent.EN


def test_listener_rotates_by_turn():
    first = ListenerAgent()(EN)
    assert first == (
        "It sounds like My boss blamed me for the delay. That must be really hard. "
        "What has been weighing on you the most?"
    )
    second = ListenerAgent()(
        EN + [{"role": "assistant", "content": first}, {"role": "user", "content": "Yes. Exactly that."}]
    )
    assert second.startswith("It makes sense that you feel this way about Yes")


def test_esconv_cycles_strategies_in_both_languages():
    agent = ESConvAgent()
    assert agent(EN) == (
        "I can only imagine how hurt and worn out you must feel, hearing yourself say "
        '"My boss blamed me for the delay".'
    )
    assert agent(ZH) == "我能感受到你心里的委屈，说出“领导当着大家的面批评了我”的时候一定很难受。"
    replies, messages = [], list(EN)
    for _ in range(5):
        replies.append(agent(messages))
        messages += [
            {"role": "assistant", "content": replies[-1]},
            {"role": "user", "content": "I just feel so tired of it all."},
        ]
    assert replies[1] == 'When you say "I just feel so tired of it all", what do you think is weighing on you most?'
    assert len(set(replies)) == 5


def test_every_baseline_is_a_policy_spec():
    for name in BASELINES:
        policy = make_policy(f"baseline:{name}")
        (reply,) = policy.act([EN], [0])
        assert isinstance(reply, str) and reply
