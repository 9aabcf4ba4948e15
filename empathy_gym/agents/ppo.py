"""PPO for LLM policies in multi-turn dialogue (RLVER, arXiv 2507.03112, section 3).

Token-level PPO as in Ouyang et al. 2022 / TRL / verl: every sampled token is an action;
the user's turns are state, never actions (masked out; GAE runs over the trainable
tokens only). See docs/training.md.

References:
    [PPO]  Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv 1707.06347.
    [GAE]  Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE", arXiv 1506.02438.
    [KL]   Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", arXiv 1909.08593.
    [37]   Huang et al. 2022, "The 37 Implementation Details of PPO" (value clipping, whitening).
    [TIS]  Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
           Training" (truncated importance sampling, :mod:`~empathy_gym.agents.mismatch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from empathy_gym.agents.config import PPOConfig
from empathy_gym.agents.rollout import Trajectory
from empathy_gym.agents.tokens import TokenData, backbone_states, pad_flat, unpad_flat
from empathy_gym.agents.trainer import MinibatchSize, RLTrainer, describe


# -- estimators and losses ---------------------------------------------------------
def masked_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    last_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the positions where ``mask`` is True.

    Positions with ``mask`` False are skipped: the next value of a trainable token is
    the value of the next *trainable* token; after the last one it is ``last_values``
    (0 where the episode ended; V(s_T) where it was truncated, the bootstrap).

        delta_t = r_t + gamma * V(s_next) - V(s_t)          [GAE eq. 11]
        A_t     = delta_t + gamma * lam * A_next            [GAE eq. 16, recursive form]
        R_t     = A_t + V(s_t)                              (the value target)

    Args:
        rewards, values: (B, T) float.
        mask: (B, T) bool or 0/1.
        gamma, lam: discount and GAE lambda in [0, 1].
        last_values: (B,) float, the value after each row's last trainable token
            (``None``: zeros, every episode ended).

    Returns:
        ``(advantages, returns)``, (B, T) float, 0 where ``mask`` is False.
    """
    mask = mask.bool()
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0]) if last_values is None else last_values.to(values)
    next_advantage = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        live = mask[:, t]
        advantages[:, t] = torch.where(live, advantage, torch.zeros_like(advantage))
        next_advantage = torch.where(live, advantage, next_advantage)
        next_value = torch.where(live, values[:, t], next_value)
    returns = (advantages + values) * mask
    return advantages, returns


def whiten(
    values: torch.Tensor, eps: float = 1e-8, mean: float | None = None, var: float | None = None
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over all elements ([37], detail 7: advantage
    normalisation); population variance. ``mean`` and ``var`` default to those of
    ``values`` (several processes pass the statistics of all their advantages)."""
    mean = values.mean() if mean is None else mean
    var = values.var(unbiased=False) if var is None else var
    return (values - mean) / torch.sqrt(torch.as_tensor(var + eps, dtype=values.dtype))


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    cliprange: float,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped surrogate objective, as a loss per token.

        ratio_t = exp(log pi(a_t|s_t) - log pi_old(a_t|s_t))                 [PPO eq. 6]
        L_t     = max(-A_t * ratio_t, -A_t * clip(ratio_t, 1-eps, 1+eps))     [PPO eq. 7, negated]
        L_t    <- w_t * L_t      with truncated importance weights            [TIS]

    The caller aggregates (a token mean over the mini-batch, as verl's ``token-mean``).

    Args:
        logprobs, old_logprobs, advantages: (n,) float over trainable tokens.
        cliprange: eps.
        weights: (n,) float, w_t = min(pi_old / pi_sampler, C) from
            :func:`~empathy_gym.agents.mismatch.tis_weights` (``None``: 1).

    Returns:
        ``(L, stats)``: (n,) float, and per-token (n,) float ``clipfrac`` (1 where the
        clipped term was chosen) and ``approx_kl`` (the k3 estimate of KL(old || new),
        Schulman 2020 "Approximating KL divergence": ratio - 1 - log ratio).
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    loss = torch.max(unclipped, clipped)
    if weights is not None:
        loss = loss * weights
    with torch.no_grad():
        stats = {"clipfrac": (clipped > unclipped).float(), "approx_kl": ratio - 1.0 - log_ratio}
    return loss, stats


def ppo_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, cliprange_value: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped value loss per token ([37], detail 9; as in OpenAI baselines and TRL).

        V_clip = V_old + clip(V - V_old, -eps_v, eps_v)
        L_V,t  = 0.5 * max((V - R)^2, (V_clip - R)^2)

    Returns:
        ``(L_V, clipfrac)``: (n,) float each, ``clipfrac`` 1 where clipping bound.
    """
    clipped_values = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    unclipped_error = (values - returns) ** 2
    clipped_error = (clipped_values - returns) ** 2
    loss = 0.5 * torch.max(unclipped_error, clipped_error)
    return loss, (clipped_error > unclipped_error).float().detach()


# -- value function ------------------------------------------------------------------
class ValueHead(nn.Module):
    """A linear value head on a backbone's last hidden state: (n, H) -> (n,) float32.
    Zero-initialised, so V = 0 before training (deterministic)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.float()).squeeze(-1)


def _hidden_size(model: Any) -> int:
    config = model.config
    return int(getattr(config, "hidden_size", None) or config.get_text_config().hidden_size)


def load_backbone(
    name: str, *, dtype: Any = "float32", device: Any = "cpu", attn_implementation: str | None = None
) -> Any:
    """The policy's base model without its language-model head (``AutoModel``), for a
    separate critic: a value head reads its last hidden states, so the LM head and the
    logits would be dead weight.

    Args:
        name: as ``policy.model`` (path, hub id, ``.gguf`` file or alias, see
            :mod:`empathy_gym.backends.models`).
        dtype, device: ``torch.dtype`` (or its name) and device.
        attn_implementation: transformers' attention implementation (``None``: default).

    Raises:
        OSError / ValueError: from transformers when the model cannot be loaded.
    """
    from transformers import AutoModel

    from empathy_gym.backends.models import resolve_model

    path, gguf_file = resolve_model(name)
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return AutoModel.from_pretrained(path, gguf_file=gguf_file, dtype=dtype, **kwargs).to(device)


def critic_state_from_causal_lm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A separate critic's saved tensors with the key names of a backbone without a
    language-model head. Checkpoints written when the critic was a whole causal LM name
    its tensors ``base_model.model.model.layers...`` (LoRA) or ``model.layers...`` and
    ``lm_head.weight`` (full fine-tuning); the backbone's are ``base_model.model.layers...``
    and ``layers...``. Keys already in the new form pass unchanged."""
    if any(key.startswith("base_model.model.model.") for key in state):
        return {
            "base_model.model." + key[len("base_model.model.model.") :]: value
            for key, value in state.items()
            if key.startswith("base_model.model.model.")
        }
    if any(key.startswith("lm_head.") for key in state):
        return {key[len("model.") :]: value for key, value in state.items() if key.startswith("model.")}
    return dict(state)


# -- the trainer -------------------------------------------------------------------------
@dataclass
class PPOBatch:
    """A step's rollouts, ready for PPO's epochs: per trajectory, flat over its
    trainable tokens (see :mod:`~empathy_gym.agents.tokens`).

    Attributes:
        old_logprobs, old_values: (n_i,) float32, under the parameters of the rollout.
        advantages, returns: (n_i,) float32, from GAE (advantages whitened when asked).
        weights: (n_i,) float32 truncated importance weights, or ``None`` (no correction).
    """

    data: list[TokenData]
    old_logprobs: list[torch.Tensor]
    old_values: list[torch.Tensor]
    advantages: list[torch.Tensor]
    returns: list[torch.Tensor]
    weights: list[torch.Tensor] | None = None


class PPOTrainer(RLTrainer):
    """PPO against the simulated user (loop, checkpoints and Ctrl-C:
    :class:`~empathy_gym.agents.trainer.RLTrainer`; loss aggregation: docs/training.md).

    The value function is a :class:`ValueHead` on the policy's own backbone
    (``critic="shared"``: its loss also trains the policy's adapters, weighted by
    ``vf_coef``, so ``policy/grad_norm`` includes its gradient) or on a separate
    copy of the base model with its own adapters (``critic="separate"``). With
    ``kl_coef`` > 0 the per-token reward gets ``-kl_coef * (log pi_old - log pi_ref)``
    [KL]; RLVER uses none. A dialogue cut at the context limit is a truncation: GAE
    bootstraps from the value of the state it was cut in, not from 0.

    Example:
        >>> from empathy_gym.agents import PPOConfig, PPOTrainer, load_recipe
        >>> config = load_recipe("agents/tiny-cpu.yaml", ["total_steps=2"], algorithm="ppo")
        >>> PPOTrainer(config).train()          # doctest: +SKIP
    """

    algorithm = "ppo"
    config_class = PPOConfig
    config: PPOConfig
    loss_metrics = (
        "loss/policy",
        "loss/value",
        "policy/entropy",
        "policy/clipfrac",
        "policy/approx_kl",
        "value/clipfrac",
    )

    def _build_algorithm(self) -> None:
        config = self.config
        self.critic_model = None
        if config.critic == "separate":
            backbone = load_backbone(
                self.base_model_name,
                dtype=config.policy.dtype,
                device=self.device,
                attn_implementation=config.policy.attn_implementation,
            )
            self.critic_model = self._wrap_policy(backbone, task_type=None)
        host = self.critic_model if self.critic_model is not None else self.model
        self.value_head = ValueHead(_hidden_size(host)).to(self.device)
        if config.kl_coef > 0:
            self._ensure_reference()

    def param_groups(self) -> list[dict[str, Any]]:
        groups = super().param_groups()
        critic = list(self.value_head.parameters())
        if self.critic_model is not None:
            critic += [p for p in self.critic_model.parameters() if p.requires_grad]
        return groups + [{"name": "value", "params": critic, "lr": self.config.critic_learning_rate}]

    def trained_modules(self) -> list[Any]:
        return [self.model, self.value_head] + ([self.critic_model] if self.critic_model is not None else [])

    def extra_state(self) -> dict[str, Any]:
        state = {"value_head": self.value_head.state_dict()}
        if self.critic_model is not None:
            state["critic"] = {
                k: v
                for k, v in self.critic_model.state_dict().items()
                if "lora_" in k or not self.config.policy.use_lora
            }
        return state

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore the value head and the separate critic (also from checkpoints written
        before the critic lost its language-model head, :func:`critic_state_from_causal_lm`).

        Raises:
            CheckpointError: the checkpoint's critic does not fit this critic (another
                model, LoRA rank or target modules).
        """
        self.value_head.load_state_dict(state["value_head"])
        if self.critic_model is not None:
            saved = critic_state_from_causal_lm(state["critic"])
            missing, unexpected = self.critic_model.load_state_dict(saved, strict=False)
            lost = [k for k in missing if "lora_" in k or not self.config.policy.use_lora]
            if unexpected or lost:
                from empathy_gym.agents.checkpoint import CheckpointError

                raise CheckpointError(
                    f"the checkpoint's critic does not fit this critic: "
                    f"{len(unexpected)} unexpected tensors (e.g. {unexpected[:2]}), "
                    f"{len(lost)} missing (e.g. {lost[:2]})"
                )

    def _forward(
        self, chunk: Sequence[TokenData], bootstrap: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
        """Flat (logprobs, entropy, values) of a micro-batch, and with ``bootstrap`` the
        (b,) values of each dialogue's last position. Entropy is ``None`` without
        gradients (:meth:`~empathy_gym.agents.trainer.RLTrainer.forward`)."""
        if self.critic_model is None:
            out = self.forward(self.model, chunk, hidden=True, last_hidden=bootstrap)
            states, last_states = out.hidden, out.last_hidden
        else:
            out = self.forward(self.model, chunk)
            states, last_states = backbone_states(
                self.critic_model, chunk, self.pad_id, self.device, self.compute_dtype, last_hidden=bootstrap
            )
        last = self.value_head(last_states) if bootstrap else None
        return out.logprobs, out.entropy, self.value_head(states), last

    def _whiten(self, values: torch.Tensor) -> torch.Tensor:
        """:func:`whiten` with the mean and variance of every process's advantages."""
        if self.processes.world == 1:
            return whiten(values)
        total, squares, count = self.processes.sum(
            [float(values.sum()), float((values**2).sum()), float(values.numel())]
        )
        mean = total / count
        return whiten(values, mean=mean, var=max(squares / count - mean**2, 0.0))

    @torch.no_grad()
    def _rollout_values(self, data: Sequence[TokenData]) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """Per-trajectory flat (old log-probs, old values) under the current parameters,
        and the (N,) bootstrap values: V(s_T) of each cut dialogue, 0 for the others."""
        logprobs, values, last_values = [], [], torch.zeros(len(data))
        self.set_training(False)
        for batch in self.micro_batches(range(len(data))):
            chunk = [data[i] for i in batch]
            lp, _, v, last = self._forward(chunk, bootstrap=True)
            counts = [d.num_trainable for d in chunk]
            logprobs += list(torch.split(lp.cpu(), counts))
            values += list(torch.split(v.cpu(), counts))
            for i, value in zip(batch, last.cpu()):
                last_values[i] = value if data[i].bootstrap else 0.0
        return logprobs, values, last_values

    def prepare(self, trajectories: Sequence[Trajectory]) -> tuple[PPOBatch, dict[str, float]]:
        """Old log-probs and values, the sampler mismatch (and TIS weights), rewards (with
        the KL penalty), GAE and whitening. Returns the batch and its statistics: the
        sampler mismatch, the KL to the reference (only with a KL term), and
        :func:`~empathy_gym.agents.trainer.describe` of the values, the value targets and
        the advantages (before whitening)."""
        config = self.config
        data = self.token_data(trajectories)
        old_logprobs, old_values, last_values = self._rollout_values(data)
        stats, weights = self.sampler_correction(data, old_logprobs)
        rewards = [d.turn_rewards.clone() for d in data]
        kl_to_reference = float("nan")
        if config.kl_coef > 0:
            ref_logprobs = self.policy_logprobs(data, reference=True)
            kls = [old - ref for old, ref in zip(old_logprobs, ref_logprobs)]
            rewards = [r - config.kl_coef * kl for r, kl in zip(rewards, kls)]  # [KL] per-token penalty
            kl_to_reference = float(torch.cat(kls).mean())

        padded_rewards, valid = pad_flat(rewards)
        padded_values, _ = pad_flat(old_values)
        advantages, returns = masked_gae(
            padded_rewards, padded_values, valid, config.gamma, config.lam, last_values=last_values
        )
        advantages, returns = unpad_flat(advantages, valid), unpad_flat(returns, valid)
        stats |= {
            **describe("value", old_values),
            **describe("value/target", returns),
            **describe("advantage", advantages),
        }
        if config.kl_coef > 0:  # without a KL term there is no reference pass, so nothing to report
            stats["policy/kl_to_reference_k1"] = kl_to_reference  # signed k1, at the rollout policy
        if config.whiten_advantages:
            flat = self._whiten(torch.cat(advantages))
            advantages = list(torch.split(flat, [len(a) for a in advantages]))
        return PPOBatch(data, old_logprobs, old_values, advantages, returns, weights), stats

    def micro_loss(
        self, batch: PPOBatch, indices: Sequence[int], size: MinibatchSize
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch's share of the mini-batch's loss:

            L = (sum_t L_t + vf_coef * sum_t L_V,t - entropy_coef * sum_t H_t) / N

        over the micro-batch's trainable tokens t (:func:`ppo_policy_loss`,
        :func:`ppo_value_loss`, H the entropy), N the mini-batch's trainable tokens over
        every process (``size.tokens``): the shares add up to the token mean.

        Returns:
            ``(L, sums)``: a 0-dim float tensor, and the sums over the micro-batch's
            tokens of each of :attr:`loss_metrics`.
        """
        config = self.config
        flat = partial(self.flat_tokens, indices=indices)
        logprobs, entropy, values, _ = self._forward([batch.data[i] for i in indices])
        pg_loss, pg_stats = ppo_policy_loss(
            logprobs,
            flat(batch.old_logprobs),
            flat(batch.advantages),
            config.cliprange,
            weights=flat(batch.weights) if batch.weights else None,
        )
        vf_loss, vf_clipfrac = ppo_value_loss(
            values, flat(batch.old_values), flat(batch.returns), config.cliprange_value
        )
        loss = (pg_loss.sum() + config.vf_coef * vf_loss.sum() - config.entropy_coef * entropy.sum()) / size.tokens
        per_token = {
            "loss/policy": pg_loss,
            "loss/value": vf_loss,
            "policy/entropy": entropy,
            "policy/clipfrac": pg_stats["clipfrac"],
            "policy/approx_kl": pg_stats["approx_kl"],
            "value/clipfrac": vf_clipfrac,
        }
        return loss, {key: float(value.detach().sum()) for key, value in per_token.items()}

    def update_metrics(
        self, batch: PPOBatch, prepared: dict[str, float], trained: dict[str, float]
    ) -> dict[str, float]:
        """The optimiser steps' means, :meth:`prepare`'s statistics, and ``value/residual``,
        the statistics of target - old value over the trainable tokens (for
        :meth:`derived_metrics`' explained variance)."""
        residuals = [target - value for target, value in zip(batch.returns, batch.old_values)]
        return trained | prepared | describe("value/residual", residuals)

    def derived_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """``value/explained_variance`` = 1 - Var(target - value) / Var(target), from the
        pooled population standard deviations of ``value/residual`` and ``value/target``
        over every process's trainable tokens (1 is perfect, <= 0 no better than the
        mean, NaN when the target is constant)."""
        target = metrics.get("value/target/std", float("nan"))
        residual = metrics.get("value/residual/std", float("nan"))
        if not target > 0:
            return {"value/explained_variance": float("nan")}
        return {"value/explained_variance": 1.0 - residual**2 / target**2}
