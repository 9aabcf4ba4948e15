"""The training loop shared by PPO and GRPO: model loading, rollouts, the update loop,
logging, checkpoints and resume. The algorithms (:mod:`~empathy_gym.agents.ppo`,
:mod:`~empathy_gym.agents.grpo`) supply :meth:`RLTrainer.prepare`,
:meth:`RLTrainer.micro_loss` and the metric hooks. See docs/training.md.

One step = one rollout phase + one update phase. Nothing in a step depends on global
RNG state (env seeds, sampling seeds and minibatch order derive from ``(seed, step,
...)``), so a resumed run continues exactly as an uninterrupted one.
"""

from __future__ import annotations

import copy
import logging
import numbers
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from empathy_gym.agents import heldout
from empathy_gym.agents.budget_forcing import with_think_budget
from empathy_gym.agents.callbacks import TrainerCallback, TrainingState
from empathy_gym.agents.checkpoint import (
    CheckpointError,
    check_resumable,
    checkpoint_candidates,
    load_checkpoint,
    save_checkpoint,
)
from empathy_gym.agents.config import TrainerConfig, to_dict, validate
from empathy_gym.agents.console import progress_postfix, tolerant, tolerant_console
from empathy_gym.agents.distributed import Processes
from empathy_gym.agents.engines import sampler_engine
from empathy_gym.agents.envs import make_session
from empathy_gym.agents.generation import TransformersGenerator
from empathy_gym.agents.interrupts import StopRequest
from empathy_gym.agents.judge import TrainingJudge
from empathy_gym.agents.memory import DecoderShape, MemoryPlan, device_capacity, plan_memory, read_shape
from empathy_gym.agents.mismatch import mismatch_stats, resolve_tis_cap, tis_weights
from empathy_gym.agents.monitors import replies_of, reply_monitors, tripped
from empathy_gym.agents.policy_model import (
    half_precision_dtype,
    load_policy,
    resolve_device,
    seed_everything,
    wrap_policy,
)
from empathy_gym.agents.rollout import RolloutEngine, RolloutInterrupted, RolloutTimes, Trajectory
from empathy_gym.agents.run_log import RunLog
from empathy_gym.agents.schedule import make_scheduler
from empathy_gym.agents.tokens import Forward, TokenData, forward_tokens, to_token_data
from empathy_gym.cpu_load import SlowStepWatch, busy_cores_warning
from empathy_gym.evaluation.run_folder import check_holds_no_other
from empathy_gym.seeding import derive_seed, set_rng_state

log = logging.getLogger(__name__)

#: Episode keys of refill rounds (:meth:`RLTrainer.refill`) under several processes:
#: process ``rank``'s ``k``-th dialogue of the step (all its rounds counted) is keyed
#: ``rollout_batch_size + rank * len(envs) * REFILL_KEY_ROUNDS + k``, above the first
#: round's keys; they stay apart while no process plays more rounds than this in a step.
REFILL_KEY_ROUNDS = 1000


class MinibatchSize(NamedTuple):
    """A mini-batch's size summed over every process: what a micro-batch's loss is
    divided by, so that accumulation and the process count leave the gradient as it is."""

    tokens: float  #: trainable tokens
    sequences: float  #: trajectories


def changed_settings(saved: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """``"key: old -> new"`` for every dotted key whose value differs between two config dicts."""
    changed = []
    for key in sorted(set(saved) | set(now)):
        old, new = saved.get(key), now.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            changed += changed_settings(old, new, f"{prefix}{key}.")
        elif old != new:
            changed.append(f"{prefix}{key}: {old!r} -> {new!r}")
    return changed


def rollout_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Per-step statistics of a rollout batch, with the replies' reward-hacking monitors
    (``monitor/*``); returns are sums of the turn rewards the env paid. See docs/training.md."""
    returns = [t.episode_return for t in trajectories]
    turns = [len(t.rewards) for t in trajectories]
    all_turns = max(1, sum(turns))
    cut = sum(t.cut for t in trajectories)
    return {
        "episode/turn_cut_rate": sum(t.cut_turns for t in trajectories) / all_turns,
        "tokens/thinking_per_turn": sum(t.thinking_tokens for t in trajectories) / all_turns,
        "tokens/reply_per_turn": sum(t.reply_tokens for t in trajectories) / all_turns,
        "episode/context_limit": float(cut),
        "episode/context_limit_rate": cut / max(1, len(trajectories)),
        "reward/mean_return": float(np.mean(returns)),
        "reward/mean_turn_reward": float(np.sum(returns) / all_turns),
        "emotion/final_mean": float(np.mean([t.emotions[-1] for t in trajectories])),
        "emotion/initial_mean": float(np.mean([t.emotions[0] for t in trajectories])),
        "episode/turns_mean": float(np.mean(turns)),
        "episode/success_rate": float(np.mean([t.termination == "success" for t in trajectories])),
        "episode/failure_rate": float(np.mean([t.termination == "failure" for t in trajectories])),
        "episode/format_error_rate": sum(t.format_errors for t in trajectories) / all_turns,
        "tokens/trainable_mean": float(np.mean([sum(t.loss_mask) for t in trajectories])),
        "tokens/sequence_mean": float(np.mean([len(t.token_ids) for t in trajectories])),
    } | reply_monitors([reply for t in trajectories for reply in replies_of(t.messages, t.language)])


def describe(prefix: str, values: Sequence[torch.Tensor]) -> dict[str, float]:
    """``<prefix>/mean``, ``/std`` (population), ``/min`` and ``/max`` over the elements of
    all ``values`` (NaN when there are none), and ``/count``, how many there are (so that
    processes can pool them: :func:`~empathy_gym.agents.distributed.pool_metrics`)."""
    flat = torch.cat([v.detach().double().flatten() for v in values]) if values else torch.zeros(0)
    if flat.numel() == 0:
        return {f"{prefix}/{name}": float("nan") for name in ("mean", "std", "min", "max")} | {f"{prefix}/count": 0.0}
    return {
        f"{prefix}/mean": float(flat.mean()),
        f"{prefix}/std": float(flat.std(unbiased=False)),
        f"{prefix}/min": float(flat.min()),
        f"{prefix}/max": float(flat.max()),
        f"{prefix}/count": float(flat.numel()),
    }


class RLTrainer:
    """Base trainer; use :class:`~empathy_gym.agents.ppo.PPOTrainer` or
    :class:`~empathy_gym.agents.grpo.GRPOTrainer`.

    Args:
        config: a :class:`PPOConfig` or :class:`GRPOConfig` (TRL's name ``args=`` works too).
        model: a loaded causal LM (``None``: load ``config.policy.model``). LoRA is
            applied here when ``config.policy.use_lora``.
        tokenizer: its tokenizer (required with ``model``; TRL's name
            ``processing_class=`` works too).
        envs: unwrapped envs to roll out in (``None``: ``rollout_batch_size`` envs of
            ``config.env`` sharing one user).
        callbacks: :class:`~empathy_gym.agents.callbacks.TrainerCallback` objects run
            around :meth:`train` (``heldout.bank`` sets ``config.env.personas`` to the
            split's training part, in place, and adds the held-out evaluation).

    Precision: see :func:`keep_trainable_in_float32` (``compute_dtype``: the autocast dtype).

    Raises:
        TypeError: no config, or both ``config`` and ``args``.
        ValueError: ``model`` without ``tokenizer``, too few ``envs``, or a float16 model
            (it would need loss scaling, which this trainer does not do: use bfloat16).
        FileExistsError: ``output_dir`` holds another kind of run (an eval's, a replay's),
            or is part of one (:func:`~empathy_gym.evaluation.run_folder.check_holds_no_other`).
    """

    algorithm = "base"
    config_class: type[TrainerConfig] = TrainerConfig
    #: the metrics the processes add up rather than average (counts and rates of a
    #: process's own, see :func:`~empathy_gym.agents.distributed.pool_metrics`)
    summed_metrics: tuple[str, ...] = ("tokens/generated", "tokens/generated_per_second")
    #: the names of the sums :meth:`micro_loss` returns; every process adds up all of
    #: them for every mini-batch, also one with none of its trajectories in it
    loss_metrics: tuple[str, ...] = ()

    def __init__(
        self,
        config: TrainerConfig | None = None,
        *,
        model: Any = None,
        tokenizer: Any = None,
        envs: Sequence[Any] | None = None,
        args: TrainerConfig | None = None,
        processing_class: Any = None,
        callbacks: Sequence[TrainerCallback] = (),
    ):
        if (config is None) == (args is None):
            raise TypeError("pass the config once: Trainer(config) or Trainer(args=config)")
        config = config if config is not None else args
        if not isinstance(config, self.config_class):
            raise TypeError(
                f"{type(self).__name__} needs a {self.config_class.__name__}, got a {type(config).__name__}"
            )
        validate(config)
        check_holds_no_other(config.output_dir, "training", error=FileExistsError)  # before heldout/ is written
        config, _ = heldout.prepare(config)  # with heldout.bank: env.personas is the training part
        self.config = config
        seed_everything(config.seed)
        self.processes = Processes(cpu=config.policy.device == "cpu" or not torch.cuda.is_available())
        self.device = resolve_device(config.policy.device)
        if self.processes.device is not None and self.processes.device.type == "cuda":
            self.device = self.processes.device  # cuda:LOCAL_RANK under a launcher
        model, tokenizer = self._load_policy(model, tokenizer if tokenizer is not None else processing_class)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer
        self.base_model_name = config.policy.model
        self.compute_dtype = half_precision_dtype(model)
        if self.compute_dtype == torch.float16:
            raise ValueError(
                "policy.dtype float16 would need loss scaling, which this trainer does not do; "
                "use bfloat16 (or float32)"
            )
        self.model = self._wrap_policy(model.to(self.device))
        self.reference: Any = None  # a frozen copy, only for KL without LoRA
        self._build_algorithm()
        self._build_optimizer()
        self._build_rollouts(envs)
        self.step = 0
        #: where :meth:`train` is: "before" (the callbacks' ``on_train_begin``, before a resumed
        #: run's checkpoint loads), "training" or "after" (``on_train_end``); for the stop message
        self.phase = "before"
        self.callbacks = list(callbacks)
        if config.heldout.bank:
            self.callbacks.append(heldout.HeldoutEvaluation(config, progress=config.progress))
        if config.heldout.user is not None:
            self.callbacks.append(TrainingJudge(config))
        self.stop_request = StopRequest()  # Ctrl-C / SIGTERM: finish the phase, save, stop
        self._dirty = False  # parameters changed since the last completed step
        self._saved_step = -1
        self.run_log: RunLog | None = None

    def _load_policy(self, model: Any, tokenizer: Any) -> tuple[Any, Any]:
        """``(model, tokenizer)`` as given, or loaded from ``policy.model`` after the memory
        plan (:attr:`memory_plan`, set either way).

        Raises:
            ValueError: ``model`` without ``tokenizer``.
            MemoryPlanError: a plan that does not fit (``policy.check_memory``).
        """
        if model is not None:
            if tokenizer is None:
                raise ValueError("pass the tokenizer together with the model")
            self.memory_plan = self.plan_memory(model)
            return model, tokenizer
        if not self.processes.is_main:
            self.processes.barrier()  # the first process fills the model caches (tiny, GGUF) first
        self.memory_plan = self.plan_memory(None)  # from the config alone: before any weight is loaded
        model, tokenizer = load_policy(self.config, self.device)
        if self.processes.is_main:
            self.processes.barrier()
        return model, tokenizer

    def _build_optimizer(self) -> None:
        """AdamW over :meth:`param_groups` and the learning-rate schedule (one warm-up per
        group: ``warmup_ratio`` for the policy, ``critic_warmup_ratio`` for the value)."""
        config = self.config
        groups = self.param_groups()
        #: parameters by name ("policy", "value"): each set is clipped to max_grad_norm on its own
        self.gradient_groups = {group.pop("name"): group["params"] for group in groups}
        self.optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
        warmups = config.warmup_ratios
        self.scheduler = make_scheduler(
            self.optimizer,
            [warmups[name] for name in self.gradient_groups],
            config.total_steps,
            config.lr_schedule,
            config.min_lr_ratio,
        )

    def _build_rollouts(self, envs: Sequence[Any] | None) -> None:
        """The generator, this process's envs and the rollout engine.

        Raises:
            ValueError: fewer envs than this process's share of ``rollout_batch_size``.
        """
        config = self.config
        local_batch = config.rollout_batch_size // self.processes.world
        self.generator = self._make_generator()
        self.session = None  # envs given: the caller's user
        if envs is None:
            on_policy = getattr(config.env.user_spec(), "on_policy", False)
            policy_user = self.make_policy_user() if on_policy else None
            self.session = make_session(config, config.generation.think, policy_user=policy_user)
            envs = self.session.envs(local_batch)
        self.envs = list(envs)
        if len(self.envs) < local_batch:
            raise ValueError(
                f"{len(self.envs)} envs for rollout_batch_size {config.rollout_batch_size}"
                + (f" over {self.processes.world} processes" if self.processes.world > 1 else "")
            )
        self.check_envs(self.envs)
        self.engine = RolloutEngine(
            self.envs,
            with_think_budget(self.generator, self.tokenizer, config.generation),
            self.tokenizer,
            max_context_tokens=config.generation.max_context_tokens,
            max_new_tokens=config.generation.max_new_tokens,
        )

    # -- set-up ------------------------------------------------------------------
    def plan_memory(self, model: Any = None) -> MemoryPlan | None:
        """Plan the run's memory (:mod:`~empathy_gym.agents.memory`) from the model's config
        (``model``'s, or ``policy.model``'s read without its weights) and this device's
        capacity; log the table (the first process).

        Returns:
            The plan, or ``None`` when the model's sizes cannot be read (a warning says why).

        Raises:
            MemoryPlanError: the plan does not fit the device and ``policy.check_memory`` is on.
        """
        config = self.config
        try:
            shape = DecoderShape.from_config(model.config) if model is not None else read_shape(config.policy.model)
        except Exception as error:  # noqa: BLE001  (any config reader's error: the loader reports it better)
            log.warning(
                "no memory plan: cannot read the sizes of %r (%s: %s)",
                config.policy.model,
                type(error).__name__,
                str(error).splitlines()[0] if str(error) else "",
            )
            return None
        capacity, name = device_capacity(self.device, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        plan = plan_memory(config, shape, capacity=capacity, device=name, processes=self.processes.world)
        if self.processes.is_main:
            log.info("%s", plan.table())
        if config.policy.check_memory:
            plan.check()
        return plan

    def _wrap_policy(self, model: Any, task_type: str | None = "CAUSAL_LM") -> Any:
        """:func:`~empathy_gym.agents.policy_model.wrap_policy` with this recipe's ``policy``."""
        return wrap_policy(model, self.config.policy, task_type)

    def make_policy_user(self) -> Any:
        """The simulated user's backend on this policy's base weights (``env.kwargs.user:
        policy``), through the generation engine's policy-user class
        (:mod:`empathy_gym.agents.engines`), given the user spec's ``backend_kwargs``."""
        user = self.config.env.user_spec()
        kwargs = dict(user.backend_kwargs) if user is not None else {}
        return sampler_engine(self.config.generation.engine).policy_user_class().on_generator(self.generator, **kwargs)

    def _make_generator(self) -> Any:
        generator = sampler_engine(self.config.generation.engine).generator_class()
        return generator.from_trainer(self, should_stop=lambda: self.stop_request.requested)

    def transformers_generator(self, **options: Any) -> TransformersGenerator:
        """A :class:`~empathy_gym.agents.generation.TransformersGenerator` of the policy with
        the recipe's sampling settings and compute dtype; ``options``: its other keywords."""
        gen = self.config.generation
        settings = {"max_new_tokens": gen.max_new_tokens, "temperature": gen.temperature, "top_p": gen.top_p}
        return TransformersGenerator(
            self.model, self.tokenizer, **settings, compute_dtype=self.compute_dtype, **options
        )

    def _build_algorithm(self) -> None:
        """Create algorithm-specific modules (value head, critic, reference)."""

    def _ensure_reference(self) -> None:
        """A frozen reference for KL: with LoRA the base model with adapters off (no copy);
        without LoRA a deep copy made now."""
        if not self.config.policy.use_lora and self.reference is None:
            self.reference = copy.deepcopy(self.model).eval()
            if self.compute_dtype is not None:  # frozen: no float32 master copy needed
                self.reference.to(self.compute_dtype)
            for parameter in self.reference.parameters():
                parameter.requires_grad_(False)

    def param_groups(self) -> list[dict[str, Any]]:
        """Optimiser parameter groups, each with a ``name`` (the policy at ``learning_rate``)."""
        return [
            {
                "name": "policy",
                "params": [p for p in self.model.parameters() if p.requires_grad],
                "lr": self.config.learning_rate,
            }
        ]

    def check_envs(self, envs: Sequence[Any]) -> None:
        """Refuse envs this algorithm's settings have no meaning for (none by default).

        Raises:
            RecipeError: see the algorithm's override.
        """

    def trained_modules(self) -> list[Any]:
        """The modules the update trains (the policy; PPO adds its critic and value head)."""
        return [self.model]

    def set_training(self, mode: bool) -> None:
        """Train mode (dropout on) for the passes with gradients, eval mode for the
        passes without, in every module the update trains."""
        for module in self.trained_modules():
            module.train(mode)

    # -- the algorithm's part -----------------------------------------------------
    def env_seeds(self, step: int) -> tuple[list[int], list[int]]:
        """``(env_seeds, groups)`` of a step: one fresh seed per dialogue by default."""
        n = self.config.rollout_batch_size
        return [derive_seed(self.config.seed, step, i) for i in range(n)], list(range(n))

    @property
    def dialogue_token_budget(self) -> int:
        """The most tokens one dialogue can give the policy to train on: every turn at
        ``max_new_tokens``, or the context if that is less (Dr. GRPO's constant)."""
        generation = self.config.generation
        return min(self.envs[0].protocol.max_turns * generation.max_new_tokens, generation.max_context_tokens)

    def derived_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Metrics computed from the step's others once the processes' are pooled (PPO's
        explained variance); none by default."""
        return {}

    def refill(
        self, trajectories: list[Trajectory], step: int, collect: Any
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """Play more dialogues after the step's first round ``trajectories`` (GRPO's dynamic
        sampling; none by default) with ``collect(env_seeds, groups) -> list[Trajectory]``.
        Returns every trajectory to train on and metrics.
        """
        return trajectories, {}

    def prepare(self, trajectories: Sequence[Trajectory]) -> tuple[Any, dict[str, float]]:
        """What the update phase needs from a step's rollouts, computed once before its
        epochs (old log-probs, advantages, ...), and its statistics.

        Returns:
            ``(batch, metrics)``: the batch has ``data``, a list of
            :class:`~empathy_gym.agents.tokens.TokenData` that mini-batches index.
        """
        raise NotImplementedError

    def micro_loss(
        self, batch: Any, indices: Sequence[int], size: MinibatchSize
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch's share of its mini-batch's loss, with gradients.

        Args:
            batch: from :meth:`prepare`.
            indices: the micro-batch, indices into ``batch.data``.
            size: the mini-batch's size over every micro-batch and process: divide by it,
                never by the micro-batch's own, so that the shares of every micro-batch
                and process add up to the mini-batch's loss.

        Returns:
            ``(loss, sums)``: a 0-dim float tensor to backpropagate, and the
            micro-batch's sums of the metrics named by :attr:`loss_metrics`.
        """
        raise NotImplementedError

    def minibatch_metrics(self, sums: dict[str, float], size: MinibatchSize) -> dict[str, float]:
        """A mini-batch's metrics from its sums of :meth:`micro_loss`'s (over every
        micro-batch and process): token means by default."""
        return {key: total / size.tokens for key, total in sums.items()}

    def update_metrics(self, batch: Any, prepared: dict[str, float], trained: dict[str, float]) -> dict[str, float]:
        """The update phase's metrics: by default :meth:`prepare`'s, then ``trained``,
        the mean over the optimiser steps of each mini-batch metric and gradient norm."""
        return prepared | trained

    def extra_state(self) -> dict[str, Any]:
        """Algorithm modules to checkpoint (state dicts)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`extra_state` returned."""

    # -- shared helpers for updates -----------------------------------------------
    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    @property
    def temperature(self) -> float:
        return self.config.generation.temperature

    def forward(
        self, model: Any, chunk: Sequence[TokenData], hidden: bool = False, last_hidden: bool = False
    ) -> Forward:
        """:func:`~empathy_gym.agents.tokens.forward_tokens` with this run's pad id,
        device, temperature, compute dtype and log-prob chunk size. Entropy only where
        gradients flow (the update's pass), and through it only when ``entropy_coef`` is
        not 0; passes without gradients compute none."""
        grad = torch.is_grad_enabled()
        return forward_tokens(
            model,
            chunk,
            self.pad_id,
            self.device,
            self.temperature,
            hidden=hidden,
            compute_dtype=self.compute_dtype,
            last_hidden=last_hidden,
            entropy=grad,
            entropy_grad=self.config.entropy_coef != 0,
            chunk_tokens=self.config.policy.logprob_chunk_tokens,
        )

    def token_data(self, trajectories: Sequence[Trajectory]) -> list[TokenData]:
        return [to_token_data(t) for t in trajectories]

    def micro_batches(self, indices: Sequence[int]) -> list[list[int]]:
        """Split ``indices`` into ``gradient_accumulation_steps`` nearly equal parts."""
        parts = np.array_split(np.asarray(indices), self.config.gradient_accumulation_steps)
        return [part.tolist() for part in parts if len(part)]

    def flat_tokens(self, per_trajectory: Sequence[torch.Tensor], indices: Sequence[int]) -> torch.Tensor:
        """The (n,) concatenation of ``per_trajectory[i]`` (each (n_i,), over a trajectory's
        trainable tokens) for ``i`` in ``indices``, on the device."""
        return torch.cat([per_trajectory[i] for i in indices]).to(self.device)

    @torch.no_grad()
    def policy_logprobs(self, data: Sequence[TokenData], *, reference: bool = False) -> list[torch.Tensor]:
        """Per-trajectory flat log-probs under the current policy (or the reference),
        without gradients, in micro-batches."""
        out: list[torch.Tensor] = []
        self.set_training(False)
        for batch in self.micro_batches(range(len(data))):
            chunk = [data[i] for i in batch]
            if reference and self.reference is not None:
                logprobs = self.forward(self.reference, chunk).logprobs
            elif reference:
                with self.model.disable_adapter():
                    logprobs = self.forward(self.model, chunk).logprobs
            else:
                logprobs = self.forward(self.model, chunk).logprobs
            out += list(torch.split(logprobs.cpu(), [d.num_trainable for d in chunk]))
        return out

    @property
    def measures_reference_nll(self) -> bool:
        """Whether each step measures ``monitor/reference_nll`` (a forward pass of the
        reference): with a threshold for it in ``monitors`` or a KL term; else it is NaN."""
        return "reference_nll" in self.config.monitors or self.config.kl_weight > 0

    def reference_nll(self, trajectories: Sequence[Trajectory]) -> float:
        """The reference model's mean negative log-likelihood, in nats per token (at the
        sampling temperature), of the tokens the policy sampled: fluency drift. The
        reference is the base model (LoRA, adapter disabled) or the KL term's frozen copy;
        NaN without one (full fine-tuning without KL) or without sampled tokens."""
        if self.reference is None and not hasattr(self.model, "disable_adapter"):
            return float("nan")
        logprobs = self.policy_logprobs(self.token_data(trajectories), reference=True)
        flat = torch.cat(logprobs) if logprobs else torch.zeros(0)
        return float(-flat.double().mean()) if flat.numel() else float("nan")

    @property
    def tis_cap(self) -> float:
        """The truncated importance sampling cap in force (0: off), see
        :func:`~empathy_gym.agents.mismatch.resolve_tis_cap`."""
        return resolve_tis_cap(self.config.tis_cap, self.config.generation.engine)

    def sampler_correction(
        self, data: Sequence[TokenData], old_logprobs: Sequence[torch.Tensor]
    ) -> tuple[dict[str, float], list[torch.Tensor] | None]:
        """The sampler-mismatch statistics of a step and, when :attr:`tis_cap` is in
        force, the truncated importance weights of every trajectory's trainable tokens
        (:mod:`~empathy_gym.agents.mismatch`)."""
        sampled = [d.rollout_logprobs for d in data]
        stats = mismatch_stats(old_logprobs, sampled, self.tis_cap)
        if not self.tis_cap or any(s is None for s in sampled):
            return stats, None
        return stats, [tis_weights(old, s, self.tis_cap) for old, s in zip(old_logprobs, sampled)]

    def global_sums(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums over the processes (e.g. a mini-batch's trainable tokens)."""
        return self.processes.sum([float(v) for v in values])

    def minibatch_order(self, step: int, epoch: int, n: int) -> list[list[int]]:
        """A seeded permutation of ``range(n)`` cut into ``num_mini_batches`` parts."""
        generator = torch.Generator().manual_seed(derive_seed(self.config.seed, step, epoch, 7))
        order = torch.randperm(n, generator=generator).tolist()
        parts = np.array_split(np.asarray(order, dtype=int), self.config.num_mini_batches)
        # several processes: every one takes num_mini_batches optimiser steps, empty or not
        return [part.tolist() for part in parts if len(part) or self.processes.world > 1]

    def clip_and_step(self) -> dict[str, float]:
        """Sum the gradients over the processes (each already divided by the mini-batch's
        global count, see :meth:`accumulate`), clip each of :attr:`gradient_groups` to
        ``max_grad_norm`` on its own (actor and critic apart, as verl's ``dp_actor.py`` and
        ``dp_critic.py``), step the optimiser.

        Returns:
            ``{"<group>/grad_norm": norm before clipping}``, e.g. ``policy/grad_norm``
            and ``value/grad_norm``.
        """
        parameters = [p for params in self.gradient_groups.values() for p in params]
        self.processes.sum_gradients(parameters)
        norms = {
            f"{name}/grad_norm": float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
            for name, params in self.gradient_groups.items()
            if params
        }
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norms

    # -- the update phase ----------------------------------------------------------
    def update(self, trajectories: Sequence[Trajectory], step: int) -> dict[str, float]:
        """One update phase: :meth:`prepare`, then ``num_ppo_epochs`` epochs of
        ``num_mini_batches`` optimiser steps (:meth:`train_epochs`). Returns metrics
        (:meth:`update_metrics`)."""
        batch, prepared = self.prepare(trajectories)
        trained = self.train_epochs(batch, step)
        self.set_training(False)
        return self.update_metrics(batch, prepared, trained)

    def train_epochs(self, batch: Any, step: int) -> dict[str, float]:
        """The optimiser steps of an update phase, one per mini-batch with trainable
        tokens (:meth:`accumulate`, then :meth:`clip_and_step`). Returns the mean over
        the steps of each mini-batch metric and gradient norm (empty without a step)."""
        stats: dict[str, list[float]] = {}
        # with several processes every one joins every mini-batch, with rollouts or without
        for epoch in range(self.config.num_ppo_epochs):
            for minibatch in self.minibatch_order(step, epoch, len(batch.data)):
                tokens, minibatch_stats = self.accumulate(batch, minibatch)
                if tokens == 0:
                    continue
                for key, value in (minibatch_stats | self.clip_and_step()).items():
                    stats.setdefault(key, []).append(value)
        return {key: float(np.mean(values)) for key, values in stats.items()}

    def accumulate(self, batch: Any, minibatch: Sequence[int]) -> tuple[float, dict[str, float]]:
        """Backpropagate one mini-batch's loss, micro-batch by micro-batch
        (:meth:`micro_loss`, divided by :class:`MinibatchSize`); no step.

        Returns:
            ``(tokens, metrics)``: the mini-batch's trainable tokens (all processes), and
            :meth:`minibatch_metrics` of its sums, the same in every process (empty when
            it has no tokens).
        """
        tokens, sequences = self.global_sums([sum(batch.data[i].num_trainable for i in minibatch), len(minibatch)])
        if tokens == 0:
            return 0.0, {}
        size = MinibatchSize(tokens, sequences)
        sums = dict.fromkeys(self.loss_metrics, 0.0)
        self.set_training(True)
        for part in self.micro_batches(minibatch):
            loss, part_sums = self.micro_loss(batch, part, size)
            loss.backward()
            for key, value in part_sums.items():
                sums[key] += value
        totals = self.global_sums(list(sums.values()))
        return tokens, self.minibatch_metrics(dict(zip(sums, totals)), size)

    # -- the loop ------------------------------------------------------------------
    def train(self, resume: bool = False) -> list[dict[str, Any]]:
        """Run until ``total_steps`` (or Ctrl-C), between the callbacks' ``on_train_begin``
        and ``on_train_end``. Returns the metrics of every step.

        Args:
            resume: continue from the newest checkpoint that loads, when there is one.

        Raises:
            FileExistsError: a fresh run in a folder that holds another run's metrics or
                another kind of run.
        """
        from tqdm.auto import tqdm

        config = self.config
        checkpoints = Path(config.output_dir) / "checkpoints"
        resume_step = None
        main = self.processes.is_main
        self._step_watch = SlowStepWatch() if main and self.device.type == "cpu" else None
        # measured before the held-out evaluation's work (ours) runs; said with the bar below
        busy = busy_cores_warning(torch.get_num_threads()) if self._step_watch is not None else None
        self.phase = "before"
        for callback in self.callbacks:
            callback.on_train_begin(self.training_state())
        if resume:
            self._resume(checkpoints)
            resume_step = self.step
        self.phase = "training"
        used: FileExistsError | None = None
        try:
            if main:
                self.run_log = RunLog(
                    config.output_dir, tensorboard=config.report_to == "tensorboard", resume_step=resume_step
                )
        except FileExistsError as error:
            used = error
        if self.processes.any(used is not None):  # every process stops with the message
            raise used or FileExistsError(
                f"{config.output_dir} already holds a run (see the first process); "
                "pass --resume to continue it, or choose another output_dir"
            )
        if self.run_log is not None:
            self.run_log.record_personas(self.envs[0].unwrapped.personas)
        self._saved_step = self.step if resume_step is not None else -1
        if main and self.memory_plan is not None:
            (Path(config.output_dir) / "memory_plan.txt").write_text(self.memory_plan.table() + "\n", encoding="utf-8")
        self.stop_request.install()
        # the bar writes to a stream that may die (`| tee log`, then Ctrl-C): never let that stop the run
        bar = tqdm(
            total=config.total_steps,
            initial=self.step,
            disable=not (config.progress and main),
            desc=f"{self.algorithm} steps",
            dynamic_ncols=True,
            file=tolerant(sys.stderr),
        )
        self._say_busy(bar, busy)
        try:
            while self.step < config.total_steps and not self.processes.any(self.stop_request.requested):
                if not self._run_step(self.step + 1, bar):
                    break
        finally:
            self.stop_request.restore()
            if not self._dirty and self.step > self._saved_step and self.step > 0:
                self.save()  # first: nothing below may cost the checkpoint
            bar.close()
            if self.run_log is not None:
                self.run_log.plot()
                self.run_log.close()
        if self.step >= config.total_steps:
            self.phase = "after"
            for callback in self.callbacks:
                callback.on_train_end(self.training_state())
        return self.run_log.read_metrics() if self.run_log else []

    def training_state(self) -> TrainingState:
        """What the callbacks are given now (:class:`~empathy_gym.agents.callbacks.TrainingState`)."""
        return TrainingState(
            config=self.config,
            step=self.step,
            session=self.session,
            sampler=self.transformers_generator,
            tokenizer=self.tokenizer,
            model=self.model,
            rank=self.processes.rank,
            world=self.processes.world,
        )

    @property
    def heldout_report(self) -> dict[str, Any] | None:
        """The held-out report (:func:`~empathy_gym.agents.heldout.report`) once training
        ended with ``heldout.bank`` set; else ``None``."""
        for callback in self.callbacks:
            if isinstance(callback, heldout.HeldoutEvaluation) and callback.report is not None:
                return callback.report
        return None

    def close(self) -> None:
        """Close the simulated users this trainer built (its session's and its callbacks',
        the second judge's); a second call does nothing. The policy stays usable."""
        if self.session is not None:
            self.session.close()
        for callback in self.callbacks:
            callback.close()

    def _resume(self, checkpoints: Path) -> None:
        """Load the first of :func:`checkpoint_candidates` that loads; none: stay at step 0.

        Raises:
            CheckpointError: another algorithm's or another policy's checkpoint, or
                checkpoints of which none loads (starting over would supersede the run's logs).
        """
        candidates = checkpoint_candidates(checkpoints)
        failures = []
        for candidate in candidates:
            try:
                self.load(candidate)
            except CheckpointError:
                raise
            except Exception as error:  # a damaged file: json, torch.load, safetensors, peft errors alike
                failures.append(
                    f"{candidate.name}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                )
                log.warning("cannot resume from %s (%s); trying an older checkpoint", candidate, failures[-1])
                continue
            log.info("resumed from %s (step %d)", candidate, self.step)
            return
        if candidates:
            raise CheckpointError(
                f"--resume: none of the {len(candidates)} checkpoints in {checkpoints} loads ({failures[0]}); "
                f"resume with the recipe the run was trained with, or give another output_dir="
            )
        log.warning("--resume: no checkpoint in %s; starting at step 0", checkpoints)

    def _run_step(self, step: int, bar: Any) -> bool:
        """One step: the rollout phase, the update phase, the step's metrics (logged and
        shown on ``bar``), and a checkpoint every ``save_steps``. Returns False when a
        Ctrl-C interrupted the rollout (the step is discarded)."""
        config = self.config
        started = time.perf_counter()
        if self.device.type == "cuda":  # memory/peak_*_gib: this step's peak
            torch.cuda.reset_peak_memory_stats(self.device)
        self.generator.sync(self.model, step)
        rollout = self._rollout(step)
        if rollout is None:
            return False
        first, trajectories, refill_metrics, times = rollout
        reference_nll = self.reference_nll(first) if self.measures_reference_nll else float("nan")
        tick = time.perf_counter()
        self._dirty = True
        rates = {f"{name}/lr": group["lr"] for name, group in zip(self.gradient_groups, self.optimizer.param_groups)}
        metrics = self.update(trajectories, step) | rates
        self.scheduler.step()  # once per training step, after its updates, as verl
        self._dirty = False
        self.step = step
        first = first if self.processes.world == 1 else self.processes.gather(first)
        metrics.update(rollout_metrics(first))
        metrics["monitor/reference_nll"] = reference_nll
        metrics.update(refill_metrics)
        metrics.update(self._time_metrics(times, started, tick))
        metrics = self.processes.reduce_metrics(metrics, summed=self.summed_metrics)
        metrics |= self.derived_metrics(metrics)
        metrics |= self.processes.from_main(lambda: self._callback_metrics(step, first))
        metrics["monitor/tripped"] = float(self._check_monitors(step, metrics))
        if self.run_log is not None:
            self.run_log.metrics(step, metrics)
            self.run_log.transcripts(step, list(trajectories[: config.transcripts_per_step]))
        bar.update(1)
        bar.set_postfix(progress_postfix(metrics))
        if self._step_watch is not None:
            self._say_busy(bar, self._step_watch.add(metrics["time/step"], step))
        if config.save_steps and step % config.save_steps == 0:
            self.save()
        return True

    def _say_busy(self, bar: Any, warning: str | None) -> None:
        """A busy-cores warning (:mod:`empathy_gym.cpu_load`) in the log and on the bar."""
        if warning:
            log.warning(warning)
            bar.set_description(f"{self.algorithm} steps (busy cores: see the log)")

    def _callback_metrics(self, step: int, trajectories: list[Trajectory]) -> dict[str, float]:
        """The callbacks' ``on_step_end`` metrics (run in the first process only).

        Raises:
            TypeError: a callback returned a metric that is not a number."""
        metrics: dict[str, float] = {}
        state = self.training_state()
        for callback in self.callbacks:
            for key, value in dict(callback.on_step_end(state, step, trajectories) or {}).items():
                if isinstance(value, bool) or not isinstance(value, numbers.Real):
                    raise TypeError(
                        f"{type(callback).__name__}.on_step_end: metric {key!r} must be a number, got {value!r}"
                    )
                metrics[key] = float(value)
        return metrics

    def _rollout(self, step: int) -> tuple[list[Trajectory], list[Trajectory], dict[str, float], RolloutTimes] | None:
        """The rollout phase of a step: the first round of this process's dialogues, then
        the algorithm's refill rounds (:meth:`refill`); episodes are written as they end
        (one process) or at the end (several, :meth:`_write_episodes`).

        Returns:
            ``(first round, every trajectory to train on, refill metrics, times)``, or
            ``None`` when a Ctrl-C in any process interrupted it.
        """
        config = self.config
        env_seeds, groups = self.env_seeds(step)
        mine = self.processes.mine(groups)
        single = self.processes.world == 1
        interrupted = False
        times = RolloutTimes()
        rounds: list[list[Trajectory]] = []

        def collect(seeds: Sequence[int], group_ids: Sequence[int]) -> list[Trajectory]:
            """Play one round of dialogues; keys run on over the step's rounds. The first
            round's sampling seeds come from each dialogue's index in the step (the same
            dialogues whatever the process count); a refill round's are this process's."""
            offset = sum(len(r) for r in rounds)
            first_round = not rounds
            sampling_seed = derive_seed(
                config.seed,
                step,
                *([] if first_round else [len(rounds)]),
                *([] if single or first_round else [self.processes.rank]),
            )
            played = self.engine.collect(
                seeds,
                groups=group_ids,
                sampling_seed=sampling_seed,
                should_stop=lambda: self.stop_request.requested,
                on_episode_end=(lambda t: self.run_log.episode(step, t)) if single else None,
                key_offset=offset,
                seed_keys=mine if first_round else None,
                round_index=len(rounds),
            )
            for name in ("generation", "user", "total", "generated_tokens"):
                setattr(times, name, getattr(times, name) + getattr(self.engine.times, name))
            rounds.append(played)
            return played

        try:
            first = collect([env_seeds[i] for i in mine], [groups[i] for i in mine])
            trajectories, refill_metrics = self.refill(first, step, collect)
        except RolloutInterrupted:
            interrupted = True
        if self.processes.any(interrupted):
            log.warning("interrupted during the rollout of step %d; it is discarded", step)
            return None
        if not single:
            self._write_episodes(step, trajectories, mine)
        return first, trajectories, refill_metrics, times

    def _write_episodes(self, step: int, trajectories: Sequence[Trajectory], mine: Sequence[int]) -> None:
        """Several processes: the first writes everyone's episodes, in key order, at the
        end of the rollout. A first-round dialogue's key is its index in the step
        (``mine[t.key]``); a refill round's comes after them (:data:`REFILL_KEY_ROUNDS`)."""
        extra = self.config.rollout_batch_size + self.processes.rank * len(self.envs) * REFILL_KEY_ROUNDS
        records = self.processes.gather(
            [{**t.record(), "key": mine[t.key] if t.key < len(mine) else extra + t.key} for t in trajectories]
        )
        if self.run_log is not None:
            for record in sorted(records, key=lambda r: r["key"]):
                self.run_log.episode_record(step, record)

    def _check_monitors(self, step: int, metrics: dict[str, float]) -> int:
        """Warn about the monitors past the recipe's thresholds (``monitors``); returns
        how many."""
        past = tripped(metrics, self.config.monitors)
        for name, value in past.items():
            log.warning(
                "step %d: reward-hacking monitor %s = %.3f is past its threshold %s (replies in episodes.jsonl)",
                step,
                name,
                value,
                self.config.monitors[name],
            )
        return len(past)

    def _time_metrics(self, times: RolloutTimes, started: float, tick: float) -> dict[str, float]:
        """The step's times (``started``: the step's start, ``tick``: the update's), its
        generation throughput, and on CUDA this step's peak memory, next to the memory
        plan's total."""
        metrics = {
            "time/rollout": times.total,
            "time/generation": times.generation,
            "time/user": times.user,
            "time/update": time.perf_counter() - tick,
            "time/step": time.perf_counter() - started,
            "tokens/generated": float(times.generated_tokens),
            "tokens/generated_per_second": times.generated_tokens / max(times.generation, 1e-9),
        }
        if self.device.type == "cuda":
            metrics["memory/peak_allocated_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            metrics["memory/peak_reserved_gib"] = torch.cuda.max_memory_reserved(self.device) / 2**30
        return metrics

    # -- checkpoints ---------------------------------------------------------------
    def save(self) -> Path | None:
        """Checkpoint the last completed step atomically (see :mod:`checkpoint`); with
        several processes the first one writes it (the weights are the same in all)
        and the others return ``None``."""
        path = None
        if self.processes.is_main:
            with tolerant_console():  # transformers draws progress bars while saving
                path = save_checkpoint(
                    Path(self.config.output_dir) / "checkpoints",
                    self.step,
                    policy=self.model,
                    tokenizer=self.tokenizer,
                    modules={
                        "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict(),
                        **self.extra_state(),
                    },
                    state={"algorithm": self.algorithm, "config": to_dict(self.config)},
                )
        self.processes.barrier()
        self._saved_step = self.step
        return path

    def load(self, path: Path) -> None:
        """Restore weights, optimiser, algorithm modules, RNG and step from a checkpoint;
        warn about settings that differ from the checkpoint's.

        Raises:
            CheckpointError: as :func:`~empathy_gym.agents.checkpoint.check_resumable`.
        """
        state, modules, rng = load_checkpoint(path)
        config = to_dict(self.config)
        check_resumable(path, state, self.algorithm, config)
        policy_dir = path / "policy"
        # read everything before changing anything: a damaged file leaves this trainer as it was
        if self.config.policy.use_lora:
            from safetensors.torch import load_file

            policy_state = load_file(str(policy_dir / "adapter_model.safetensors"))
        else:
            from transformers import AutoModelForCausalLM

            policy_state = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=self.model.dtype).state_dict()
        changed = changed_settings(state.get("config") or {}, config)
        if changed:
            log.warning(
                "resuming with settings that differ from the checkpoint's: %s (they apply from now on, except the "
                "learning rate and its schedule, which continue as saved with the optimiser)",
                "; ".join(changed),
            )
        if self.config.policy.use_lora:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, policy_state)
        else:
            self.model.load_state_dict(policy_state)
        self.optimizer.load_state_dict(modules["optimizer"])
        if "scheduler" in modules:
            self.scheduler.load_state_dict(modules["scheduler"])
        else:  # a checkpoint from before schedules: the rates of its step
            for _ in range(int(state["step"]) - self.scheduler.last_epoch):
                self.scheduler.step()
        self.load_extra_state(modules)
        set_rng_state(rng)
        self.step = int(state["step"])
