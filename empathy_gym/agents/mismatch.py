"""The sampler is not quite the trainer: statistics of their mismatch and truncated
importance sampling (the ``sampler/*`` metrics: docs/training.md, "Sampling").

The engine's log-probs differ from the trainer's for the same tokens and weights (other
kernels, reduction orders, bfloat16 adapters), so the update is slightly off-policy.
Yao et al. 2025 ("Your Efficient RL Framework Secretly Brings You Off-Policy RL
Training", fengyao.notion.site/off-policy-rl, section "Truncated Importance Sampling")
weight each token's policy-gradient loss by

    w_t = min(pi_trainer(a_t | s_t) / pi_sampler(a_t | s_t), C)        (C = 2 there)

as verl does (``tis_imp_ratio_cap``: old over rollout log-prob, clamped, multiplying
the per-token policy loss).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from empathy_gym.agents.engines import sampler_engine


def mismatch_stats(
    trainer_logprobs: Sequence[torch.Tensor], sampler_logprobs: Sequence[torch.Tensor | None], cap: float = 0.0
) -> dict[str, float]:
    """Per-step statistics of the sampler/trainer mismatch, with r = pi_trainer / pi_sampler.

    Args:
        trainer_logprobs: per trajectory, (n_i,) float, the trainer's old log-probs.
        sampler_logprobs: per trajectory, (n_i,) float, the engine's recorded ones
            (``None`` entries are skipped).
        cap: the truncated importance sampling cap (0: no correction).

    Returns:
        ``sampler/kl``: KL(sampler || trainer), the k3 estimate mean(r - 1 - log r),
        unbiased as the tokens were drawn from the sampler (Schulman 2020,
        "Approximating KL divergence"); ``sampler/max_ratio``, ``sampler/min_ratio``: the
        extremes of r; ``sampler/tis_capped``: the share of tokens with r > cap (0
        without correction); NaN when no token has both; and ``sampler/count``, the
        tokens they are over.
    """
    pairs = [(t, s) for t, s in zip(trainer_logprobs, sampler_logprobs) if s is not None and len(s)]
    if not pairs:
        return dict.fromkeys(
            ("sampler/kl", "sampler/max_ratio", "sampler/min_ratio", "sampler/tis_capped"), float("nan")
        ) | {"sampler/count": 0.0}
    log_ratio = torch.cat([t.double() for t, _ in pairs]) - torch.cat([s.double() for _, s in pairs])
    ratio = torch.exp(log_ratio)
    return {
        "sampler/kl": float((ratio - 1.0 - log_ratio).mean()),
        "sampler/count": float(len(ratio)),
        "sampler/max_ratio": float(ratio.max()),
        "sampler/min_ratio": float(ratio.min()),
        "sampler/tis_capped": float((ratio > cap).double().mean()) if cap > 0 else 0.0,
    }


def tis_weights(trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """(n,) float32 truncated importance weights w_t = min(exp(log pi_trainer - log
    pi_sampler), cap) (Yao et al. 2025; see the module docstring), without gradient.

    Args:
        trainer_logprobs, sampler_logprobs: (n,) float, the same tokens.
        cap: C > 0.

    Raises:
        ValueError: ``cap`` <= 0, or the two have different lengths.
    """
    if cap <= 0:
        raise ValueError(f"the truncated importance sampling cap must be > 0, got {cap}")
    if trainer_logprobs.shape != sampler_logprobs.shape:
        raise ValueError(
            f"{tuple(trainer_logprobs.shape)} trainer log-probs but {tuple(sampler_logprobs.shape)} sampler log-probs"
        )
    ratio = torch.exp(trainer_logprobs.detach().double() - sampler_logprobs.detach().double())
    return torch.clamp(ratio, max=cap).float()


def resolve_tis_cap(cap: float | None, engine: str) -> float:
    """The cap in force: the recipe's ``tis_cap``, or when it is ``None`` the engine's
    default (:attr:`~empathy_gym.agents.engines.SamplerEngine.tis_cap`: 2.0 for vLLM
    rollouts, Yao et al.'s C; 0, off, for the transformers engine, where generation and
    training run the same model code and agree up to rounding).

    Raises:
        ValueError: an unknown engine.
    """
    if cap is not None:
        return float(cap)
    return sampler_engine(engine).tis_cap
