"""The TRL adapter (empathy_gym.integrations.trl): masks, fields, rewards, and a GRPO step."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from script_modules import load_script

from empathy_gym.agents.generation import TransformersGenerator
from empathy_gym.agents.rollout import ChatTokens
from empathy_gym.backends.models import load_causal_lm
from empathy_gym.boundary import clean_text
from empathy_gym.integrations.trl import EmpathyRollout, episode_return_reward, final_emotion_reward
from empathy_gym.user.scripted import ScriptedUser

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trl_grpo.py"


class Recorder:
    """Wraps a generator and records every batch of samples it returns, in order."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, seeds):
        samples = self.inner.generate(prompts, seeds)
        self.calls.append(samples)
        return samples


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_causal_lm(str(tiny_model_dir))


def runs(mask):
    """(start, end) of each run of 1s in a 0/1 list."""
    out, start = [], None
    for i, bit in enumerate(list(mask) + [0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            out.append((start, i))
            start = None
    return out


def test_masked_tokens_are_exactly_what_the_policy_sampled(tiny):
    """ScriptedUser proposes +5, -20, +10 from 40 (SAGE clamps -20 to -10): emotions
    40, 45, 35, 45, return 0.05 - 0.10 + 0.10 = 0.05, three turns (max_turns=3)."""
    model, tokenizer = tiny
    recorder = Recorder(TransformersGenerator(model, tokenizer, max_new_tokens=12, temperature=1.0))
    rollout = EmpathyRollout(
        env_kwargs={"user": ScriptedUser([5, -20, 10]), "max_turns": 3}, generator=recorder, seed=1
    )
    dataset = rollout.dataset(2, seed=0)
    prompts = [dataset[0]["prompt"]] * 2 + [dataset[1]["prompt"]] * 2  # two GRPO groups of 2
    trainer = SimpleNamespace(processing_class=tokenizer, state=SimpleNamespace(global_step=0))
    out = rollout(prompts, trainer)

    assert out["env_seed"] == [dataset[0]["env_seed"]] * 2 + [dataset[1]["env_seed"]] * 2
    assert out["emotions"] == [[40, 45, 35, 45]] * 4 and out["final_emotion"] == [45] * 4
    assert out["episode_return"] == pytest.approx([0.05] * 4)
    assert out["termination"] == ["max_turns"] * 4
    assert [len(call) for call in recorder.calls] == [4, 4, 4]  # 4 dialogues, 3 batched turns
    chat = ChatTokens(tokenizer)
    for i, trajectory in enumerate(rollout.last_trajectories):
        prompt, completion = out["prompt_ids"][i], out["completion_ids"][i]
        mask, logprobs = out["env_mask"][i], out["logprobs"][i]
        assert prompt == chat.prompt(prompts[i]) and prompt + completion == trajectory.token_ids
        assert len(mask) == len(logprobs) == len(completion) and mask[0] == 1
        turns = runs(mask)
        assert len(turns) == 3
        samples = [call[i] for call in recorder.calls]
        replies = [m["content"] for m in trajectory.messages if m["role"] == "assistant"]
        for (start, end), sample, reply in zip(turns, samples, replies):
            assert completion[start:end] == sample.token_ids  # the sampled ids, untouched
            assert logprobs[start:end] == sample.logprobs
            # the env's messages hold the reply with control characters removed (clean_text)
            assert clean_text(tokenizer.decode(completion[start:end], skip_special_tokens=True))[0] == reply
        unmasked = [t for t, bit in zip(completion, mask) if not bit]
        assert all(lp == 0.0 for lp, bit in zip(logprobs, mask) if not bit)
        assert "reply 1 (emotion 45)" in tokenizer.decode(unmasked)
        assert "reply 2 (emotion 35)" in tokenizer.decode(unmasked)


def test_unknown_prompts_and_reward_functions():
    rollout = EmpathyRollout(env_kwargs={"max_turns": 2})
    rollout.dataset(3)
    with pytest.raises(KeyError, match="was not made by EmpathyRollout.dataset"):
        rollout.seed_of([{"role": "user", "content": "hello"}])
    assert episode_return_reward(["a", "b"], episode_return=[0.1, -0.05]) == [0.1, -0.05]
    assert final_emotion_reward(["a", "b"], final_emotion=[45, 100], trainer_state=None) == [0.45, 1.0]


def test_grpo_trainer_runs_the_example_for_one_step(tiny_model_dir):
    example = load_script(EXAMPLE)
    trainer = example.main(
        [
            "--model",
            str(tiny_model_dir),
            "--steps",
            "1",
            "--prompts",
            "2",
            "--generations",
            "2",
            "--max-turns",
            "2",
            "--max-new-tokens",
            "8",
        ]
    )
    (logged,) = [r for r in trainer.state.log_history if "reward" in r]
    # Two turns of eight sampled tokens each: with these seeds the tiny random model never
    # samples its end-of-turn token early.
    assert logged["completions/mean_length"] == 16.0
