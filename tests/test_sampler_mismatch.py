"""Sampler mismatch: the statistics of the engine's log-probs against the trainer's, and
truncated importance sampling (Yao et al. 2025), worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from empathy_gym.agents.grpo import GRPOBatch, grpo_loss
from empathy_gym.agents.mismatch import mismatch_stats, resolve_tis_cap, tis_weights
from empathy_gym.agents.ppo import ppo_policy_loss


def test_mismatch_statistics_by_hand():
    # pi_trainer / pi_sampler = 0.5 / 0.25 = 2 and 0.2 / 0.4 = 0.5
    trainer = [torch.tensor([math.log(0.5), math.log(0.2)])]
    sampler = [torch.tensor([math.log(0.25), math.log(0.4)])]
    stats = mismatch_stats(trainer, sampler, cap=1.5)
    # k3: (2 - 1 - ln 2 + 0.5 - 1 - ln 0.5) / 2 = (0.5 - ln 2 + ln 2) / 2 = 0.25
    assert stats["sampler/kl"] == pytest.approx(0.25)
    assert stats["sampler/max_ratio"] == pytest.approx(2.0)
    assert stats["sampler/min_ratio"] == pytest.approx(0.5)
    assert stats["sampler/tis_capped"] == pytest.approx(0.5)
    assert mismatch_stats(trainer, sampler)["sampler/tis_capped"] == 0.0
    assert math.isnan(mismatch_stats(trainer, [None])["sampler/kl"])


def test_truncated_weights_are_the_ratio_capped():
    weights = tis_weights(
        torch.tensor([math.log(0.5), math.log(0.2)]), torch.tensor([math.log(0.25), math.log(0.4)]), cap=1.5
    )
    assert weights.tolist() == pytest.approx([1.5, 0.5])
    with pytest.raises(ValueError, match="cap must be > 0"):
        tis_weights(torch.zeros(1), torch.zeros(1), cap=0)


def test_the_cap_is_on_for_vllm_and_off_for_transformers_unless_set():
    assert resolve_tis_cap(None, "vllm") == 2.0
    assert resolve_tis_cap(None, "transformers") == 0.0
    assert resolve_tis_cap(3.0, "transformers") == 3.0
    assert resolve_tis_cap(0.0, "vllm") == 0.0


def test_the_correction_multiplies_each_tokens_loss_by_its_weight():
    logprobs = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    old = torch.tensor([-1.1, -1.5, -0.5, -2.0])
    advantages = torch.tensor([1.0, -1.0, 0.5, 2.0])
    weights = torch.tensor([2.0, 0.3, 1.0, 1.7])
    plain, _ = ppo_policy_loss(logprobs, old, advantages, 0.2)
    weighted, _ = ppo_policy_loss(logprobs, old, advantages, 0.2, weights=weights)
    assert torch.allclose(weighted, plain * weights)
    plain, _ = grpo_loss(logprobs, old, advantages, 0.2, epsilon_high=0.28)
    weighted, _ = grpo_loss(logprobs, old, advantages, 0.2, epsilon_high=0.28, weights=weights)
    assert torch.allclose(weighted, plain * weights)
    # the KL term to the reference is not reweighted
    ref = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    plain, stats = grpo_loss(logprobs, old, advantages, 0.2, ref_logprobs=ref, beta=0.5)
    weighted, _ = grpo_loss(logprobs, old, advantages, 0.2, ref_logprobs=ref, beta=0.5, weights=weights)
    assert torch.allclose(weighted - 0.5 * stats["kl"], (plain - 0.5 * stats["kl"]) * weights)


def _one_dialogue(tokenizer):
    from empathy_gym.agents.rollout import Trajectory

    t = Trajectory(
        key=0,
        group=0,
        env_seed=0,
        persona_id="p",
        language="en",
        hidden_intention="x",
        character_type="passive",
        emotions=[40, 45],
    )
    t.extend([5, 6, 7], trainable=False)
    t.extend([8, 9, tokenizer.eos_token_id], trainable=True, logprobs=[0.0] * 3)
    t.turn_ends.append(len(t.token_ids) - 1)
    t.rewards.append(0.05)
    return t


def test_the_trainer_weights_the_gradient_by_the_capped_ratio(tmp_path):
    """A sampler that gave every token a quarter of the trainer's probability: the ratio is
    4, capped at 2, so the policy gradient is exactly twice the uncorrected one."""
    from empathy_gym.agents import GRPOTrainer, load_recipe

    config = load_recipe(
        "agents/tiny-cpu.yaml",
        [f"output_dir={tmp_path}", "rollout_batch_size=4", "progress=false", "entropy_coef=0.0", "tis_cap=2.0"],
        algorithm="grpo",
    )
    run = GRPOTrainer(config)
    data = run.token_data([_one_dialogue(run.tokenizer)])
    old = run.policy_logprobs(data)
    data[0].rollout_logprobs = old[0] - math.log(4.0)
    stats, weights = run.sampler_correction(data, old)
    assert weights[0].tolist() == pytest.approx([2.0] * 3)
    assert stats["sampler/max_ratio"] == pytest.approx(4.0, rel=1e-5)
    assert stats["sampler/kl"] == pytest.approx(4.0 - 1.0 - math.log(4.0), rel=1e-5)
    assert stats["sampler/tis_capped"] == 1.0

    def gradient(batch):
        run.optimizer.zero_grad(set_to_none=True)
        run.accumulate(batch, [0])
        return torch.cat([p.grad.flatten() for p in run.model.parameters() if p.grad is not None])

    advantages = [torch.tensor([1.0, -0.5, 0.25])]
    corrected = gradient(GRPOBatch(data, old, advantages, weights=weights))
    plain = gradient(GRPOBatch(data, old, advantages))
    assert plain.abs().max() > 0 and torch.allclose(corrected, 2.0 * plain, atol=1e-6)


def test_the_transformers_engine_agrees_with_the_trainer(tmp_path):
    """The generator's recorded log-probs line up with the trainer's, token for token:
    KL near 0 and ratios near 1 (a misaligned token would give ratios far from 1)."""
    from empathy_gym.agents import PPOTrainer, load_recipe

    config = load_recipe(
        "agents/tiny-cpu.yaml",
        [f"output_dir={tmp_path}", "rollout_batch_size=2", "progress=false", "total_steps=1", "report_to=tensorboard"],
        algorithm="ppo",
    )
    (metrics,) = PPOTrainer(config).train()
    assert metrics["sampler/kl"] < 1e-6
    assert abs(metrics["sampler/max_ratio"] - 1) < 1e-3 and abs(metrics["sampler/min_ratio"] - 1) < 1e-3
    assert metrics["sampler/tis_capped"] == 0.0
    # value and advantage statistics, turns cut by length, thinking and reply tokens:
    # in metrics.jsonl and in TensorBoard
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    keys = [
        "value/mean",
        "value/std",
        "value/min",
        "value/max",
        "advantage/mean",
        "advantage/std",
        "advantage/min",
        "advantage/max",
        "episode/turn_cut_rate",
        "tokens/thinking_per_turn",
        "tokens/reply_per_turn",
        "sampler/kl",
        "sampler/max_ratio",
    ]
    assert all(isinstance(metrics[k], float) for k in keys)
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert set(keys) <= set(events.Tags()["scalars"])
    # tiny-cpu.yaml samples at most 4 tokens a turn, rarely an end-of-turn token among them
    assert 0.5 < metrics["episode/turn_cut_rate"] <= 1.0
    turns = metrics["episode/turns_mean"] * 2
    assert metrics["tokens/thinking_per_turn"] == 0.0  # think mode is off
    assert metrics["tokens/reply_per_turn"] * turns == pytest.approx(metrics["tokens/generated"])
