"""Budget forcing (s1's, for think-then-say): every turn thinks and replies, the added tags
are never trained on, and the turns are those the policy would sample given the tags."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from empathy_gym.agents.budget_forcing import CLOSING, OPENING, BudgetForcing
from empathy_gym.agents.generation import TransformersGenerator
from empathy_gym.agents.rollout import RolloutEngine, Sample
from empathy_gym.agents.tokens import forward_tokens, to_token_data
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.personas import Persona
from empathy_gym.user.scripted import ScriptedUser

PERSONA = Persona(
    id="p0",
    language="en",
    profile="p",
    scenario="s",
    hidden_intention="deep_empathy",
    character_type="passive",
    opening_line="I feel lost.",
)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


class ScriptedSampler:
    """Answers each call with the next (text, finished) pair for every row, and records
    the prompts, seeds and token limits it was given."""

    def __init__(self, tokenizer, outputs):
        self.tokenizer, self.outputs, self.calls = tokenizer, list(outputs), []

    def generate(self, prompts, seeds, max_new_tokens=None):
        self.calls.append(([list(p) for p in prompts], list(seeds), max_new_tokens))
        text, finished = self.outputs.pop(0)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = ids + [self.tokenizer.eos_token_id] if finished else ids
        return [Sample(ids, [-1.0] * len(ids), finished) for _ in prompts]


def play_one_turn(tokenizer, sampler, think_budget=8, max_new_tokens=20):
    seen = []
    env = EmpathyDialogueEnv(
        [PERSONA], user=ScriptedUser(change_fn=lambda r: seen.append(r.utterance) or 5), think=True, max_turns=1
    )
    forcing = BudgetForcing(sampler, tokenizer, think_budget=think_budget, max_new_tokens=max_new_tokens)
    (trajectory,) = RolloutEngine([env], forcing, tokenizer).collect([0], sampling_seed=3)
    return trajectory, seen


def test_a_block_the_policy_never_closes_is_closed_for_it_and_only_the_sampled_tokens_are_trained(tiny):
    _, tokenizer = tiny
    sampler = ScriptedSampler(tokenizer, [("She feels lost", True), ("That sounds so heavy.", True)])
    trajectory, seen = play_one_turn(tokenizer, sampler)
    # the user saw the reply alone, and the format was kept: no penalty
    assert seen == ["That sounds so heavy."]
    assert trajectory.format_errors == 0 and trajectory.rewards == [0.05]
    # the thinking's end-of-turn token was dropped and </think> forced in its place: the
    # reply was sampled after prompt + <think> + thinking + </think>
    (thinking_prompt,), seeds, limit = sampler.calls[0]
    (reply_prompt,), reply_seeds, reply_limit = sampler.calls[1]
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(thinking_prompt[-len(encode(OPENING)) :]) == OPENING
    assert reply_prompt == thinking_prompt + encode("She feels lost") + encode(CLOSING)
    assert (limit, reply_limit) == (8, 12) and reply_seeds != seeds
    trained = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask) if m]
    assert tokenizer.decode(trained) == "She feels lost" + "That sounds so heavy." + tokenizer.eos_token
    turn = trajectory.token_ids[len(thinking_prompt) - len(encode(OPENING)) : trajectory.turn_ends[0] + 1]
    assert (
        tokenizer.decode(turn) == OPENING + "She feels lost" + CLOSING + "That sounds so heavy." + tokenizer.eos_token
    )
    assert {lp for lp, m in zip(trajectory.rollout_logprobs, trajectory.loss_mask) if m} == {-1.0}


def test_a_block_the_policy_closes_itself_gets_only_the_opening_tag(tiny):
    _, tokenizer = tiny
    sampler = ScriptedSampler(tokenizer, [("Be gentle.</think> I am here with you.", True)])
    trajectory, seen = play_one_turn(tokenizer, sampler, think_budget=16)
    assert len(sampler.calls) == 1 and seen == ["I am here with you."] and trajectory.format_errors == 0
    trained = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask) if m]
    assert tokenizer.decode(trained) == "Be gentle.</think> I am here with you." + tokenizer.eos_token


def test_thinking_cut_at_the_budget_is_closed_and_the_reply_keeps_its_own_budget(tiny):
    _, tokenizer = tiny
    sampler = ScriptedSampler(tokenizer, [("one two three four", False), ("Tell me more.", False)])
    trajectory, seen = play_one_turn(tokenizer, sampler, think_budget=4, max_new_tokens=10)
    assert [call[2] for call in sampler.calls] == [4, 6]
    assert seen == ["Tell me more."] and trajectory.format_errors == 0
    assert trajectory.cut_turns == 1  # the reply was cut: an end token closes it, not trained on


@pytest.mark.parametrize("think_budget", [0, 20, 25])
def test_a_budget_that_leaves_no_reply_is_refused(tiny, think_budget):
    _, tokenizer = tiny
    with pytest.raises(ValueError, match=r"think_budget must be in \[1, generation.max_new_tokens=20\)"):
        BudgetForcing(None, tokenizer, think_budget=think_budget, max_new_tokens=20)


def test_a_random_policy_keeps_the_format_only_when_forced_and_its_log_probs_match_training(tiny):
    """The tiny random model never writes </think>: without forcing every turn is a format
    error; with it none is, and the sampler's log-probs at the trained tokens equal a
    training forward pass over the whole dialogue (so the tags the policy was shown are
    the tags in the trajectory)."""
    model, tokenizer = tiny

    def play(forced):
        env = EmpathyDialogueEnv([PERSONA], user=ScriptedUser(change_fn=lambda r: 5), think=True, max_turns=3)
        generator = TransformersGenerator(model, tokenizer, max_new_tokens=12)
        if forced:
            generator = BudgetForcing(generator, tokenizer, think_budget=5, max_new_tokens=12)
        return RolloutEngine([env], generator, tokenizer).collect([0], sampling_seed=2)[0]

    short = TransformersGenerator(model, tokenizer, max_new_tokens=12).generate([[1, 2, 3]], [0], max_new_tokens=3)
    assert len(short[0].token_ids) == 3 and not short[0].finished  # the call's own limit
    plain, forced = play(False), play(True)
    assert (plain.format_errors, len(plain.rewards)) == (3, 3)
    assert (forced.format_errors, len(forced.rewards)) == (0, 3)
    assert play(True).token_ids == forced.token_ids
    with torch.no_grad():
        logprobs, *_ = forward_tokens(model, [to_token_data(forced)], tokenizer.pad_token_id, torch.device("cpu"), 1.0)
    sampled = torch.tensor([lp for lp, m in zip(forced.rollout_logprobs, forced.loss_mask) if m])
    assert torch.allclose(logprobs, sampled, atol=1e-4)
    text = tokenizer.decode(forced.token_ids)
    assert (text.count(OPENING), text.count(CLOSING)) == (3, 3)


def test_the_trainer_and_its_held_out_evaluation_both_force_the_budget(tmp_path):
    """``generation.think_budget`` reaches both samplers of a run: the rollouts' and the
    held-out evaluation's (the tiny random policy never closes a block on its own)."""
    import json

    from empathy_gym.agents import GRPOTrainer, load_recipe

    overrides = ["progress=false", "total_steps=1", "rollout_batch_size=4", "env.kwargs.max_turns=2"]
    overrides += ["heldout.bank=en", "heldout.test_fraction=0.2", "heldout.repeats=1", "generation.think=true"]
    overrides += ["generation.max_new_tokens=10", "generation.think_budget=4", f"output_dir={tmp_path}"]
    trainer = GRPOTrainer(load_recipe("agents/tiny-cpu.yaml", overrides, algorithm="grpo"))
    trainer.train()
    (metrics,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert metrics["episode/format_error_rate"] == 0.0
    for name in ("before", "after"):
        records = [json.loads(line) for line in (tmp_path / "heldout" / f"{name}.jsonl").read_text().splitlines()]
        assert len(records) == 8 and sum(r["format_errors"] for r in records) == 0
        assert all(OPENING in m["content"] for r in records for m in r["messages"] if m["role"] == "assistant")


def test_a_smaller_turn_limit_for_one_call_still_leaves_the_reply_a_token(tiny):
    _, tokenizer = tiny
    sampler = ScriptedSampler(tokenizer, [("hmm", False), ("Yes.", True)])
    BudgetForcing(sampler, tokenizer, think_budget=8, max_new_tokens=20).generate([[1, 2]], [0], max_new_tokens=4)
    assert [call[2] for call in sampler.calls] == [3, 1]  # was: 3, then -4


def test_eval_samples_a_local_policy_as_training_did_when_given_its_budget(tiny_model_dir, tmp_path):
    """``hf:PATH,think_budget=N`` under ``eval --think``: every turn thinks and keeps the
    format, reproducibly, where the same model without it never does."""
    from empathy_gym.evaluation.benchmark import evaluate

    def run(spec, out):
        return evaluate(
            spec, [PERSONA], user=ScriptedUser(change_fn=lambda r: 5), think=True, out_dir=out, max_tokens=10
        )

    forced = run(f"hf:{tiny_model_dir},think_budget=4", tmp_path / "forced")
    plain = run(f"hf:{tiny_model_dir}", tmp_path / "plain")
    turns = [m["content"] for m in forced.records[0]["messages"] if m["role"] == "assistant"]
    assert turns and all(t.startswith(OPENING) and CLOSING in t for t in turns)
    assert forced.records[0]["format_errors"] == 0 and plain.records[0]["format_errors"] == len(turns)
    again = run(f"hf:{tiny_model_dir},think_budget=4", tmp_path / "again")
    assert again.records[0]["messages"] == forced.records[0]["messages"]


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        ("hf:m,think_budget=4", {"max_tokens": 10}, r"think_budget starts every reply inside <think>; evaluate with"),
        ("hf:m,think_budget=10", {"max_tokens": 10, "think": True}, r"think_budget=10 needs a reply cap above it"),
        ("hf:m,think_budget=4", {"max_tokens": 0, "think": True}, r"needs a reply cap above it \(--max-tokens, now no"),
        ("hf:m,think_budget=lots", {"think": True}, r"think_budget must be an int >= 1, got 'lots'"),
        ("openai:m@http://127.0.0.1:9/v1,think_budget=4", {"think": True}, r"unknown option\(s\) \['think_budget'\]"),
    ],
)
def test_a_bad_budget_on_a_policy_spec_is_refused_before_anything_loads(spec, options, message, tmp_path):
    from empathy_gym.evaluation.benchmark import evaluate
    from empathy_gym.user.specs import SpecError

    with pytest.raises(SpecError, match=message):
        evaluate(spec, [PERSONA], user=ScriptedUser(change_fn=lambda r: 5), out_dir=tmp_path / "o", **options)
    assert not (tmp_path / "o").exists()


def test_the_cached_states_of_a_thought_whose_end_token_was_dropped_are_discarded(tiny):
    """No later prompt extends prompt + thinking + end token, so a key/value cache that
    kept it would hold it until the next weight sync (one per dialogue and turn)."""
    _, tokenizer = tiny
    discarded = []
    sampler = ScriptedSampler(tokenizer, [("She feels lost", True), ("That sounds so heavy.", True)])
    sampler.prefix_cache = type("Cache", (), {"discard": lambda self, ids: discarded.append(list(ids))})()
    play_one_turn(tokenizer, sampler)
    (thinking_prompt,), _, _ = sampler.calls[0]
    ended = tokenizer("She feels lost", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert discarded == [thinking_prompt + ended]


def test_prefix_cache_discard_drops_only_that_sequence():
    from empathy_gym.backends.prefix_cache import PrefixKVCache

    cache = PrefixKVCache(max_tokens=100)
    states = [(torch.zeros(1, 3, 2), torch.zeros(1, 3, 2))]
    cache.add([1, 2, 3], states)
    cache.add([1, 2, 4], states)
    cache.discard([1, 2])  # a prefix of both: not an entry
    cache.discard([1, 2, 3])
    assert [list(e.ids) for e in cache.entries.values()] == [[1, 2, 4]]


def test_a_dialogue_must_have_room_for_the_forced_tags_too(tiny):
    """Room for max_new_tokens sampled tokens but not for the tags as well: refused at the
    start (was: the turn was cut short, a reply that kept to its budget counted as cut)."""
    _, tokenizer = tiny
    env = EmpathyDialogueEnv([PERSONA], user=ScriptedUser(change_fn=lambda r: 5), think=True, max_turns=1)
    forcing = BudgetForcing(ScriptedSampler(tokenizer, []), tokenizer, think_budget=8, max_new_tokens=20)
    opening = len(RolloutEngine([env], forcing, tokenizer).chat.prompt(env.reset(seed=0)[1]["messages"]))
    just_enough = opening + 20 + forcing.forced_tokens + 1
    assert RolloutEngine([env], forcing, tokenizer, max_context_tokens=just_enough).fits_a_turn(opening)
    assert not RolloutEngine([env], forcing, tokenizer, max_context_tokens=just_enough - 1).fits_a_turn(opening)
    with pytest.raises(ValueError, match="does not fit in max_context_tokens"):
        RolloutEngine([env], forcing, tokenizer, max_context_tokens=just_enough - 1).collect([0])


def test_an_evaluation_policy_under_budget_forcing_keeps_no_states_and_closes_its_model(tiny_model_dir):
    from empathy_gym.evaluation.policies import make_policy

    policy = make_policy(f"hf:{tiny_model_dir},think_budget=4", max_tokens=10)
    assert policy.generator.generator.prefix_cache is None  # an evaluation never syncs: they would pile up
    closed = []
    policy.backend.close = lambda: closed.append(True)
    policy.close()
    assert closed == [True]
