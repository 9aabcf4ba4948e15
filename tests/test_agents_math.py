"""Estimators and losses against values worked out by hand."""

import math
from types import SimpleNamespace

import pytest
import torch

from empathy_gym.agents.grpo import (
    GRPOTrainer,
    aggregate,
    degenerate_groups,
    group_advantages,
    grpo_loss,
    reward_to_go_advantages,
)
from empathy_gym.agents.ppo import masked_gae, ppo_policy_loss, ppo_value_loss, whiten


def test_gae_skips_masked_positions_gamma_lambda_one():
    # Two agent turns (positions 0-2 and 4-5) around a masked user token at 3, whose
    # value (9.9) and reward must be ignored. With gamma = lambda = 1,
    # A_t = (sum of later rewards) - V_t: e.g. A_0 = (0.1 - 0.05) - 0.5 = -0.45.
    rewards = torch.tensor([[0.0, 0.0, 0.1, 0.0, 0.0, -0.05]])
    values = torch.tensor([[0.5, 0.4, 0.3, 9.9, 0.2, 0.1]])
    mask = torch.tensor([[1, 1, 1, 0, 1, 1]])
    advantages, returns = masked_gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert advantages.tolist()[0] == pytest.approx([-0.45, -0.35, -0.25, 0.0, -0.25, -0.15])
    assert returns.tolist()[0] == pytest.approx([0.05, 0.05, 0.05, 0.0, -0.05, -0.05])


def test_gae_with_discount():
    # t=2: delta = 2 + 0 - 1 = 1, A = 1.
    # t=0 (t=1 is masked): delta = 1 + 0.5 * V_2 - V_0 = 1 + 0.5 - 0.5 = 1; A = 1 + 0.5*0.5*1 = 1.25.
    advantages, returns = masked_gae(
        torch.tensor([[1.0, 7.0, 2.0]]), torch.tensor([[0.5, 3.0, 1.0]]), torch.tensor([[1, 0, 1]]), gamma=0.5, lam=0.5
    )
    assert advantages.tolist()[0] == pytest.approx([1.25, 0.0, 1.0])
    assert returns.tolist()[0] == pytest.approx([1.75, 0.0, 2.0])


def test_gae_rows_are_independent():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    advantages, _ = masked_gae(rewards, torch.zeros(2, 2), torch.tensor([[1, 1], [1, 0]]))
    assert advantages.tolist() == [[1.0, 1.0], [0.0, 0.0]]


def test_gae_bootstraps_a_truncated_row_from_the_value_of_its_last_state():
    # Row 0 was cut at the context limit, V(s_T) = 0.3; row 1 ended (next value 0).
    # Row 0: t=1: delta = 0.1 + 0.3 - 0.4 = 0, A = 0; t=0: delta = 0 + 0.4 - 0.5 = -0.1, A = -0.1.
    # Row 1: t=1: delta = 0.1 - 0.4 = -0.3; t=0: delta = -0.1, A = -0.1 - 0.3 = -0.4.
    rewards = torch.tensor([[0.0, 0.1], [0.0, 0.1]])
    values = torch.tensor([[0.5, 0.4], [0.5, 0.4]])
    advantages, returns = masked_gae(rewards, values, torch.ones(2, 2), last_values=torch.tensor([0.3, 0.0]))
    assert advantages.flatten().tolist() == pytest.approx([-0.1, 0.0, -0.4, -0.3])
    assert returns.flatten().tolist() == pytest.approx([0.4, 0.4, 0.1, 0.1])


def test_whiten():
    out = whiten(torch.tensor([1.0, 2.0, 3.0]))
    # mean 2, population variance 2/3
    assert out.tolist() == pytest.approx([-1.224744, 0.0, 1.224744], abs=1e-5)


def test_ppo_clipped_policy_loss_by_hand():
    ratio = torch.tensor([1.5, 0.5, 1.1])
    logprobs, old = torch.log(ratio), torch.zeros(3)
    advantages = torch.tensor([1.0, 1.0, -2.0])
    loss, stats = ppo_policy_loss(logprobs, old, advantages, cliprange=0.2)
    # token 1: max(-1.5, -1.2) = -1.2 (clipped); token 2: max(-0.5, -0.8) = -0.5;
    # token 3: max(2.2, 2.2) = 2.2.
    assert loss.tolist() == pytest.approx([-1.2, -0.5, 2.2])
    assert stats["clipfrac"].tolist() == [1.0, 0.0, 0.0]
    assert stats["approx_kl"].tolist() == pytest.approx([r - 1 - math.log(r) for r in (1.5, 0.5, 1.1)])


def test_ppo_loss_gradient_is_zero_where_clipped():
    logprobs = torch.log(torch.tensor([1.5, 0.9])).requires_grad_(True)
    loss, _ = ppo_policy_loss(logprobs, torch.zeros(2), torch.tensor([1.0, 1.0]), cliprange=0.2)
    loss.mean().backward()
    # d/dlogp of -A*ratio/2 = -ratio/2 for the unclipped token; 0 for the clipped one.
    assert logprobs.grad.tolist() == pytest.approx([0.0, -0.45])


def test_ppo_value_loss_by_hand():
    loss, clipfrac = ppo_value_loss(
        torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), torch.tensor([1.0, 1.0]), cliprange_value=0.2
    )
    # clipped values 0.7 and 0.3; errors max((0, 0.09), (1.0, 0.49)) = (0.09, 1.0)
    assert loss.tolist() == pytest.approx([0.5 * 0.09, 0.5 * 1.0])
    assert clipfrac.tolist() == [1.0, 0.0]


def test_group_advantages_with_a_zero_variance_group():
    returns = torch.tensor([0.1, 0.3, 0.2, 0.2, 0.2, 0.5, -0.1])
    groups = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    advantages, degenerate = group_advantages(returns, groups)
    # group 0: mean 0.2, sample std 0.1; group 2: mean 0.2, sample std sqrt(0.18) = 0.424264
    expected = [-0.1 / 0.1001, 0.1 / 0.1001, 0.0, 0.0, 0.0, 0.3 / (0.4242641 + 1e-4), -0.3 / (0.4242641 + 1e-4)]
    assert advantages.tolist() == pytest.approx(expected, abs=1e-5)
    assert degenerate.tolist() == [False, False, False, True, True, False, False]
    centred, _ = group_advantages(returns, groups, scale=False)
    assert centred.tolist() == pytest.approx([-0.1, 0.1, 0.0, 0.0, 0.0, 0.3, -0.3], abs=1e-6)


def test_single_member_group_is_degenerate():
    advantages, degenerate = group_advantages(torch.tensor([1.0]), torch.tensor([4]))
    assert advantages.tolist() == [0.0] and degenerate.tolist() == [True]


def test_reward_to_go_advantages_by_hand():
    # One group: A with turn rewards (0.1, -0.05), B with (0.0,), C with (0.05, 0.05, 0.1).
    # Returns-to-go: A (0.05, -0.05), B (0.0,), C (0.2, 0.15, 0.1).
    # Turn 0 compares A, B, C: mean 1/12, sample std sqrt(0.0216667 / 2) = 0.1040833.
    # Turn 1 compares A and C: mean 0.05, sample std sqrt(0.02) = 0.1414214.
    # Turn 2: C alone, nothing to compare with: 0.
    s0, s1 = math.sqrt(((0.05 - 1 / 12) ** 2 + (1 / 12) ** 2 + (0.2 - 1 / 12) ** 2) / 2), math.sqrt(0.02)
    rewards = [torch.tensor([0.1, -0.05]), torch.tensor([0.0]), torch.tensor([0.05, 0.05, 0.1])]
    adv, degenerate = reward_to_go_advantages(rewards, [0, 0, 0])
    assert adv[0].tolist() == pytest.approx([(0.05 - 1 / 12) / (s0 + 1e-4), -0.1 / (s1 + 1e-4)], abs=1e-5)
    assert adv[1].tolist() == pytest.approx([(0.0 - 1 / 12) / (s0 + 1e-4)], abs=1e-5)
    assert adv[2].tolist() == pytest.approx([(0.2 - 1 / 12) / (s0 + 1e-4), 0.1 / (s1 + 1e-4), 0.0], abs=1e-5)
    assert adv[0].tolist() == pytest.approx([-0.31994, -0.70661], abs=1e-4)
    assert degenerate.tolist() == [False, False, False]
    centred, _ = reward_to_go_advantages(rewards, [0, 0, 0], scale=False)
    assert centred[2].tolist() == pytest.approx([0.2 - 1 / 12, 0.1, 0.0], abs=1e-6)


def test_reward_to_go_does_not_charge_a_longer_dialogue_for_its_length():
    """Two dialogues reach the same emotion, one in two turns (0.1, 0.0), one in one
    (0.1,). Compared at the same turn index they do not differ: no signal. (Pooling the
    group's rewards, mean 1/15, gave the longer one -0.58 and the shorter +0.58.)"""
    adv, degenerate = reward_to_go_advantages([torch.tensor([0.1, 0.0]), torch.tensor([0.1])], [0, 0])
    assert adv[0].tolist() == [0.0, 0.0] and adv[1].tolist() == [0.0]
    assert degenerate.tolist() == [True, True]


def test_returns_equal_up_to_float_noise_are_a_degenerate_group():
    # Turn rewards -10, +1, +9 emotion points sum to -1.4e-17, not 0: the same final emotion
    # as the others', not a signal (even in float32, where -1.4e-17 != 0 too).
    returns = [sum([-0.1, 0.01, 0.09]), 0.0, 0.0, 0.0]
    assert returns[0] != 0.0
    for dtype in (torch.float32, torch.float64):
        advantages, degenerate = group_advantages(torch.tensor(returns, dtype=dtype), torch.tensor([0, 0, 0, 0]))
        assert degenerate.tolist() == [True] * 4 and advantages.tolist() == [0.0] * 4
    advantages, degenerate = group_advantages(
        torch.tensor([0.1 + 0.2, 0.3, 0.3], dtype=torch.float64), torch.tensor([0, 0, 0])
    )
    assert degenerate.tolist() == [True] * 3
    _, degenerate = reward_to_go_advantages(
        [torch.tensor([0.1, 0.2], dtype=torch.float64), torch.tensor([0.3, 0.0], dtype=torch.float64)], [0, 0]
    )
    assert degenerate.tolist() == [False, False]  # turn 0's returns-to-go are equal, turn 1's are not (0.2, 0)
    _, degenerate = reward_to_go_advantages(
        [torch.tensor([0.1, 0.2], dtype=torch.float64), torch.tensor([0.3], dtype=torch.float64)], [0, 0]
    )
    assert degenerate.tolist() == [True, True]


def test_grpo_loss_token_versus_sequence_mean():
    # ratio 1 everywhere, so every token's loss is -A: three tokens of -1, one of +2.
    logprobs = torch.zeros(4)
    advantages = torch.tensor([1.0, 1.0, 1.0, -2.0])
    segments = torch.tensor([0, 0, 0, 1])
    per_token, _ = grpo_loss(logprobs, logprobs, advantages, 0.2)
    assert per_token.tolist() == [-1.0, -1.0, -1.0, 2.0]
    assert float(aggregate(per_token, segments, "token_mean", 4, 2)) == pytest.approx(-0.25)  # (-3 + 2) / 4
    assert float(aggregate(per_token, segments, "sequence_mean", 4, 2)) == pytest.approx(0.5)  # mean(-1, 2)
    # a micro-batch's share: the same two rollouts inside a mini-batch of 10 tokens, 5 rollouts
    assert float(aggregate(per_token, segments, "token_mean", 10, 5)) == pytest.approx(-0.1)
    assert float(aggregate(per_token, segments, "sequence_mean", 10, 5)) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="loss_type"):
        aggregate(per_token, segments, "mean", 4, 2)


def test_grpo_k3_kl_term():
    logprobs = torch.zeros(2)
    ref = logprobs - math.log(2)  # pi_ref / pi = 1/2: k3 = 1/2 - ln(1/2) - 1 = ln 2 - 1/2
    loss, stats = grpo_loss(logprobs, logprobs, torch.zeros(2), 0.2, ref_logprobs=ref, beta=0.1)
    assert stats["kl"].tolist() == pytest.approx([math.log(2) - 0.5] * 2)
    assert loss.tolist() == pytest.approx([0.1 * (math.log(2) - 0.5)] * 2)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        grpo_loss(logprobs, logprobs, torch.zeros(2), 0.2, beta=0.1)


def test_grpo_clip_direction():
    # A > 0 and ratio 1.5: min(1.5, 1.2) * A -> the clipped term; A < 0 and ratio 0.5:
    # min(-0.5, -0.8) -> clipped too (pessimistic bound).
    logprobs = torch.log(torch.tensor([1.5, 0.5]))
    loss, stats = grpo_loss(logprobs, torch.zeros(2), torch.tensor([1.0, -1.0]), 0.2)
    assert loss.tolist() == pytest.approx([-1.2, 0.8])
    assert stats["clipfrac"].tolist() == [1.0, 1.0]


def test_clip_higher_raises_only_the_upper_bound():
    """DAPO's clip-higher: eps_low 0.2, eps_high 0.28. A > 0, ratio 1.25: inside [0.8, 1.28],
    unclipped (with a symmetric 0.2 it would be cut to 1.2). A < 0, ratio 0.7: the lower
    bound 0.8 still binds."""
    logprobs = torch.log(torch.tensor([1.25, 0.7, 1.4]))
    advantages = torch.tensor([1.0, -1.0, 1.0])
    loss, stats = grpo_loss(logprobs, torch.zeros(3), advantages, 0.2, epsilon_high=0.28)
    assert loss.tolist() == pytest.approx([-1.25, 0.8, -1.28])
    assert stats["clipfrac"].tolist() == [0.0, 1.0, 1.0]
    symmetric, _ = grpo_loss(logprobs, torch.zeros(3), advantages, 0.2)
    assert symmetric.tolist() == pytest.approx([-1.2, 0.8, -1.2])


def test_dr_grpo_divides_by_a_constant_not_by_lengths():
    """Two rollouts, 4 tokens and 1 token, every token's loss 1. token_mean and
    sequence_mean both give 1; Dr. GRPO divides the sum 5 by 2 rollouts x 10 tokens."""
    per_token = torch.ones(5)
    segments = torch.tensor([0, 0, 0, 0, 1])
    assert float(aggregate(per_token, segments, "token_mean", 5, 2)) == pytest.approx(1.0)
    assert float(aggregate(per_token, segments, "sequence_mean", 5, 2)) == pytest.approx(1.0)
    assert float(aggregate(per_token, segments, "dr_grpo", 5, 2, max_tokens=10)) == pytest.approx(0.25)
    # the longer rollout now weighs 4 times the shorter: its tokens are not averaged away
    long_only = aggregate(per_token[:4], segments[:4], "dr_grpo", 5, 2, max_tokens=10)
    assert float(long_only) == pytest.approx(
        4 * float(aggregate(per_token[4:], segments[4:] * 0, "dr_grpo", 5, 2, max_tokens=10))
    )
    with pytest.raises(ValueError, match="needs max_tokens"):
        aggregate(per_token, segments, "dr_grpo", 5, 2)


def rollout(group, total):
    from empathy_gym.agents.rollout import Trajectory

    t = Trajectory(
        key=0,
        group=group,
        env_seed=0,
        persona_id="p",
        language="en",
        hidden_intention="x",
        character_type="passive",
        emotions=[40],
    )
    t.rewards = [total]
    return t


def refill_host(budget, groups=2, size=2, envs=4):
    config = SimpleNamespace(
        dynamic_sampling_budget=budget,
        num_generations=size,
        rollout_batch_size=groups * size,
        seed=0,
        advantage="episode",
    )
    return SimpleNamespace(config=config, processes=SimpleNamespace(world=1, rank=0), envs=[None] * envs)


def test_dynamic_sampling_refills_skipped_groups_until_they_are_replaced():
    """Group 0 has no spread, group 1 has. The first refill group has none either, the
    second has: two rounds of one group each, then nothing is missing."""
    first = [rollout(0, 0.1), rollout(0, 0.1), rollout(1, 0.1), rollout(1, 0.3)]
    assert degenerate_groups(first) == {0}
    answers = iter([[0.2, 0.2], [0.0, 0.5]])
    calls = []

    def collect(seeds, groups):
        calls.append((list(seeds), list(groups)))
        returns = next(answers)
        return [rollout(g, r) for g, r in zip(groups, returns)]

    played, metrics = GRPOTrainer.refill(refill_host(budget=3), first, 1, collect)
    assert metrics == {"grpo/refill_groups": 2.0, "grpo/refill_rounds": 2.0}
    assert len(played) == 8 and played[:4] == first
    (seeds1, groups1), (seeds2, groups2) = calls
    assert seeds1[0] == seeds1[1] and seeds2[0] == seeds2[1] and seeds1[0] != seeds2[0]  # a group shares its seed
    assert len({*groups1, *groups2, 0, 1}) == 4  # new group ids
    assert degenerate_groups(played) == {0, groups1[0]}


def test_dynamic_sampling_stops_at_its_budget_and_is_off_at_zero():
    first = [rollout(0, 0.1), rollout(0, 0.1), rollout(1, 0.2), rollout(1, 0.2)]
    calls = []

    def collect(seeds, groups):
        calls.append(len(seeds))
        return [rollout(g, 0.0) for g in groups]  # never any spread

    played, metrics = GRPOTrainer.refill(refill_host(budget=3), first, 1, collect)
    # two groups missing; rounds of min(missing 2, budget, 2 groups of envs): 2, then 1
    assert calls == [4, 2] and metrics == {"grpo/refill_groups": 3.0, "grpo/refill_rounds": 2.0}
    assert GRPOTrainer.refill(refill_host(budget=0), first, 1, collect) == (first, {})
