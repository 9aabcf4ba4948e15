"""EmpathyStrategy-v0: ESConv strategies as discrete actions (empathy_gym.integrations.strategy_env)."""

import json
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from script_modules import load_script

import empathy_gym  # noqa: F401  (registers the ids)
from empathy_gym.backends.base import ChatBackend
from empathy_gym.integrations.strategies import STRATEGIES, TemplateError, load_templates, user_words
from empathy_gym.integrations.strategy_env import FEATURES, EmpathyStrategyEnv
from empathy_gym.personas import Persona, load_personas, split_personas
from empathy_gym.user.scripted import ScriptedUser

ANA = Persona(
    id="ana",
    language="en",
    name="Ana",
    profile="Ana, 30, nurse.",
    scenario="Ana was blamed.",
    hidden_intention="not_at_fault",
    character_type="negative",
    opening_line="They blamed me. Why?",
)
LIN = Persona(
    id="lin",
    language="zh",
    name="小林",
    profile="小林，25岁，程序员。",
    scenario="小林的方案被组长否定了。",
    hidden_intention="deep_empathy",
    character_type="avoidant",
    opening_line="唉，我真的不知道该怎么办了？",
)
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sb3_ppo_strategy.py"


def test_passes_sb3_and_gymnasium_env_checkers():
    from gymnasium.utils.env_checker import check_env as gymnasium_check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    env = gym.make("EmpathyStrategy-v0")
    assert env.action_space == gym.spaces.Discrete(8)
    assert env.observation_space.shape == (16,) == (len(FEATURES),)
    assert env.observation_space.dtype == np.float32
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # SB3 warns about spaces it cannot use
        sb3_check_env(env.unwrapped)
    gymnasium_check_env(env.unwrapped)


def test_observation_features_worked_out_by_hand():
    """Opening "They blamed me. Why?": 4 words -> 0.1, a question, one negative cue
    ("blamed") -> 1/3. ScriptedUser +5 then -20 (clamped to -10) from 40."""
    env = EmpathyStrategyEnv([ANA], user=ScriptedUser([5, -20]))
    obs, info = env.reset(seed=0)
    expected = np.zeros(16, np.float32)
    expected[[0, 3, 4, 5]] = [0.40, 0.1, 1.0, 1 / 3]
    np.testing.assert_allclose(obs, expected, rtol=1e-6)
    obs, reward, terminated, truncated, info = env.step(2)
    # reply "reply 1 (emotion 45)": 4 words, no question, no cue
    expected = np.zeros(16, np.float32)
    expected[[0, 1, 2, 3, 8 + 2]] = [0.45, 0.5, 1 / 9, 0.1, 1.0]  # turn 1 of SAGE's 9
    np.testing.assert_allclose(obs, expected, rtol=1e-6)
    assert reward == pytest.approx(0.05) and info["strategy"] == "reflection_of_feelings"
    obs, reward, *_ = env.step(np.int64(7))
    assert obs[0] == pytest.approx(0.35) and obs[1] == -1.0 and obs[2] == pytest.approx(2 / 9)
    assert obs[8 + 7] == 1.0 and obs[8:].sum() == 1.0 and reward == pytest.approx(-0.10)


def test_chinese_features_and_templates():
    """ "唉，我真的不知道该怎么办了？": 12 CJK characters -> 6 words -> 0.15; a question;
    negative cues 唉 and 不 -> 2/3; Chinese -> feature 7 is 1."""
    env = EmpathyStrategyEnv([LIN], user=ScriptedUser([5]))
    obs, _ = env.reset(seed=0)
    np.testing.assert_allclose(obs[:8], [0.40, 0, 0, 0.15, 1, 2 / 3, 0, 1], rtol=1e-6)
    words = user_words("唉，我真的不知道该怎么办了？")
    assert words == "我真的不知道该怎么办了"
    _, _, _, _, info = env.step(0)
    assert info["utterance"] in load_templates("zh").variants("question", words=words, name="小林")
    assert (
        load_templates("zh").variants("question", words="方案被否了", name=None)[0]
        == "你说“方案被否了”，你觉得这件事对你来说意味着什么？"
    )


def test_english_templates_fill_words_and_name_and_skip_what_cannot_be_filled():
    templates = load_templates("en")
    assert templates.variants("others", words="", name=None) == [
        "Thank you for telling me all of this.",
        "I'm glad you reached out to talk today.",
        "Thanks for sharing that with me, really.",
        "It means a lot that you'd talk to me about this.",
        "I appreciate you taking the time to share this.",
    ]
    assert "Hi Ana, thank you for trusting me with this." in templates.variants("others", words="", name="Ana")
    assert (
        user_words("Ugh. Everyone acts like this is on me, and I don't think it is.")
        == "Everyone acts like this is on me"
    )
    assert user_words("") == ""
    assert set(load_templates("en").templates) == set(load_templates("zh").templates) == set(STRATEGIES)


def test_the_same_strategy_never_repeats_an_utterance_until_its_variants_run_out():
    env = EmpathyStrategyEnv([ANA], user=ScriptedUser([0]), max_turns=8)
    env.reset(seed=3)
    said = [env.step(4)[4]["utterance"] for _ in range(8)]
    # eight affirmation variants, each used once (the four without {words} would repeat
    # under eight draws with replacement)
    assert len(set(said)) == 8


def test_errors_name_the_problem(tmp_path):
    env = EmpathyStrategyEnv([ANA], user=ScriptedUser([0]))
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"must be in \[0, 8\), got 8"):
        env.step(8)
    with pytest.raises(ValueError, match="must be an integer"):
        env.step(1.5)
    with pytest.raises(ValueError, match="writer must be"):
        EmpathyStrategyEnv([ANA], writer="magic")
    bad = json.loads((Path(load_templates("en").path)).read_text())
    bad["strategies"]["question"][0] = "Tell me about {topic}?"
    (tmp_path / "en.json").write_text(json.dumps(bad))
    with pytest.raises(TemplateError, match=r"en.json: field 'strategies/question/0': unknown placeholder \{topic\}"):
        EmpathyStrategyEnv([ANA], templates_dir=str(tmp_path))


class WriterBackend(ChatBackend):
    name = "writer"

    def __init__(self):
        self.chats = []

    def _generate(self, conversations, sampling, seeds):
        self.chats += list(conversations)
        return ["  You sound worn down by all of this.  "]

    def choice_logprobs(self, conversations, options):
        raise NotImplementedError


def test_llm_writer_is_asked_for_the_strategy():
    writer = WriterBackend()
    env = EmpathyStrategyEnv([ANA], user=ScriptedUser([5]), writer=writer)
    env.reset(seed=0)
    _, _, _, _, info = env.step(2)
    assert info["utterance"] == "You sound worn down by all of this."
    (chat,) = writer.chats
    assert "Reflection of Feelings" in chat[0]["content"] and chat[0]["role"] == "system"
    assert chat[1:] == [{"role": "user", "content": "They blamed me. Why?"}]


def test_the_writer_is_named_as_a_user_spec_names_its_backend():
    """writer= takes what user= takes for its backend (issue 38): a spec string or a ready
    backend; the old flat keywords still work, with a DeprecationWarning."""
    from empathy_gym.backends.openai_backend import OpenAIBackend
    from empathy_gym.user.specs import SpecError

    env = EmpathyStrategyEnv([ANA], user=ScriptedUser([5]), writer="openai:qwen@http://127.0.0.1:9/v1,max_retries=0")
    backend = env.writer_backend
    assert isinstance(backend, OpenAIBackend) and (backend.model, backend.base_url) == ("qwen", "http://127.0.0.1:9/v1")
    assert env._owns_writer
    env.close()
    for bad, message in [
        ("magic", r"writer must be 'templates', a backend spec \(transformers:PATH, vllm:PATH, openai:MODEL@URL, or"),
        ("rule", "got 'rule'"),
        ("policy", "got 'policy'"),  # only a trainer builds it (it read "policy needs a model, e.g. policy")
        ("openai:qwen", r"'openai:qwen': expected openai:MODEL@URL"),
        ("hf", r"'hf': hf needs a model, e.g. hf:PATH"),
        ("openai", r"'openai': openai needs a model, e.g. openai:MODEL@URL"),
        (
            "openai:q@http://127.0.0.1:9/v1,temperature=0.2",
            r"unknown option\(s\) \['temperature'\]; the openai backend "
            r"takes .*max_retries.*\(the writer's sampling: writer_temperature=",
        ),
        (3, "got 3"),
    ]:
        with pytest.raises(SpecError, match=message):
            EmpathyStrategyEnv([ANA], writer=bad)
    assert EmpathyStrategyEnv([ANA], writer_backend="openai").writer_backend is None  # templates: nothing built
    writer = WriterBackend()
    with pytest.warns(DeprecationWarning, match="writer='openai:MODEL@URL'"):
        old = EmpathyStrategyEnv([ANA], user=ScriptedUser([5]), writer="llm", writer_backend=writer)
    old.reset(seed=0)
    assert old.step(2)[4]["utterance"] == "You sound worn down by all of this." and not old._owns_writer


def test_split_personas_is_stratified_disjoint_and_seeded():
    bank = load_personas()  # 56 personas, 7 per hidden intention
    train, test = split_personas(bank, 0.25, seed=0)
    assert (len(train), len(test)) == (40, 16)  # round(0.25 * 7) = 2 held out per intention
    assert {p.id for p in train}.isdisjoint(p.id for p in test)
    assert {p.id for p in train} | {p.id for p in test} == {p.id for p in bank}
    for intention in {p.hidden_intention for p in bank}:
        assert sum(p.hidden_intention == intention for p in test) == 2
    assert split_personas(bank, 0.25, seed=0) == (train, test)
    assert split_personas(bank, 0.25, seed=1)[1] != test
    with pytest.raises(ValueError, match="test_fraction must be in"):
        split_personas(bank, 1.0)


def test_sb3_example_beats_the_random_strategy_on_held_out_personas():
    """The example, shortened (30k PPO steps, 2 episodes per held-out persona), seed 0."""
    example = load_script(EXAMPLE)
    results = example.main(["--timesteps", "30000", "--episodes", "2", "--seed", "0"])
    assert len(results["PPO (trained)"]) == 16 * 2
    assert results["PPO (trained)"].mean() > results["random strategy"].mean() + 3
