"""The Sentient benchmark (SAGE, arXiv 2505.02847), ``empathy-gym eval``: play a policy
against a persona bank with a simulated user and report the mean final emotion.

SAGE's rules, each with its file and line in SAGE's code: :mod:`empathy_gym.user.protocol`.
Every dialogue has its own seed (:func:`dialogue_seed`), so its outcome does not depend on
which others ran with it or on batching (exactly so with the rule user; LLM backends as far
as they honour seeds). With an ``out_dir``, each finished dialogue is appended to
``transcripts.jsonl`` as it ends and a rerun resumes (:class:`~empathy_gym.evaluation.run_folder.RunFolder`).
See docs/evaluation.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from empathy_gym.engine import Driver, Start, StepResult, play
from empathy_gym.env import SAGE_AGENT_SYSTEM_PROMPTS, EmpathyDialogueEnv
from empathy_gym.evaluation.must_not import dialogue_violations
from empathy_gym.evaluation.policies import Policy, make_policy, reply_token_cap, spec_sampling, spec_think_budget
from empathy_gym.evaluation.run_folder import TRANSCRIPTS, EvaluationError, RunFolder, read_jsonl_records
from empathy_gym.personas import CHARACTER_TYPES, INTENTIONS, Persona, PersonaSource, load_personas
from empathy_gym.seeding import derive_seed
from empathy_gym.session import Session
from empathy_gym.user import SimulatedUser, resolve_protocol
from empathy_gym.user.difficulty import load_difficulty
from empathy_gym.user.protocol import protocol_name
from empathy_gym.user.specs import SpecError, UserSpec, as_user_spec

PLOT = "trajectories.png"

#: Fields of a transcript record that identify its dialogue.
KEY_FIELDS: tuple[str, ...] = ("persona_id", "repeat", "seed")

#: The bootstrap's reference (percentile interval).
BOOTSTRAP_SOURCE = (
    "Efron & Tibshirani (1993), An Introduction to the Bootstrap, Chapman & Hall, ch. 13 (percentile intervals)"
)


@dataclass(frozen=True)
class Task:
    """One dialogue to run: a persona, a repeat index (0-based) and its seed (int in [0, 2**31 - 1])."""

    persona: Persona
    repeat: int
    seed: int

    @property
    def key(self) -> tuple[str, int, int]:
        """``(persona_id, repeat, seed)``, the dialogue's key in the transcripts."""
        return (self.persona.id, self.repeat, self.seed)


def dialogue_seed(seed: int, persona_id: str, repeat: int) -> int:
    """The seed of one dialogue: a function of the run seed, the persona id and the repeat
    index only (not of the persona's position, ``limit`` or batching)."""
    return derive_seed(seed, persona_id, repeat)


def plan_tasks(personas: Sequence[Persona], *, repeats: int = 1, seed: int = 0, limit: int | None = None) -> list[Task]:
    """The dialogues of a run, persona by persona, ``repeats`` (>= 1) each; ``limit`` (>= 1)
    keeps the first ``limit`` personas (``None``: all).

    Raises:
        EvaluationError: ``repeats`` < 1 or ``limit`` < 1.
    """
    if repeats < 1:
        raise EvaluationError(f"repeats must be >= 1, got {repeats}")
    if limit is not None and limit < 1:
        raise EvaluationError(f"limit must be >= 1, got {limit}")
    chosen = personas[:limit] if limit is not None else personas
    return [Task(p, r, dialogue_seed(seed, p.id, r)) for p in chosen for r in range(repeats)]


# -- running dialogues ---------------------------------------------------------------
@dataclass
class _Running:
    task: Task
    info: dict[str, Any]
    steps: list[dict[str, Any]] = field(default_factory=list)
    record: dict[str, Any] | None = None  # the transcript line, once the dialogue has ended


def dialogue_record(
    task: Task, info: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], emotions: Sequence[int]
) -> dict[str, Any]:
    """One finished dialogue as a JSON-serialisable dict (a line of ``transcripts.jsonl``).

    Fields: ``persona_id``, ``repeat``, ``seed`` (the key); ``language``,
    ``hidden_intention``, ``character_type``; ``initial_emotion``, ``final_emotion``
    (ints in [0, 100]); ``emotions`` (after each user turn, e_0 first: turns + 1 ints);
    ``turns`` (agent turns, int >= 1); ``termination`` (``"success"``, ``"failure"``,
    ``"goodbye"`` or ``"max_turns"``); ``format_errors`` (think-mode malformed turns); ``steps`` (per
    turn: ``utterance`` that reached the user, proposed ``change``, ``applied_change``,
    ``emotion``, user ``thoughts``, ``format_error``, with the rule user ``features``: the
    appraisal's parts by feature group in emotion points, and the :func:`action_flags` that are
    set); ``messages`` (the agent-side chat);
    for a persona with ``must_not`` checks, ``must_not``: ``{"checks": [ids], "hits": {id:
    [turns]}}`` (:mod:`~empathy_gym.evaluation.must_not`).
    """
    persona = task.persona
    record = {
        "persona_id": persona.id,
        "repeat": task.repeat,
        "seed": task.seed,
        "language": persona.language,
        "hidden_intention": persona.hidden_intention,
        "character_type": persona.character_type,
        "initial_emotion": int(emotions[0]),
        "final_emotion": int(emotions[-1]),
        "emotions": [int(e) for e in emotions],
        "turns": len(steps),
        "termination": info["termination_reason"],
        "format_errors": sum(1 for s in steps if s["format_error"] is not None),
        "steps": list(steps),
        "messages": info["messages"],
    }
    if persona.must_not:
        utterances = [step["utterance"] for step in steps]
        hits = dialogue_violations(utterances, persona.language, persona.must_not)
        record["must_not"] = {"checks": list(persona.must_not), "hits": hits}
    return record


#: The env's ``info`` flags on the agent's utterance that a transcript step keeps (when set).
ACTION_FLAGS = ("action_injection", "action_sanitized", "action_truncated")


def action_flags(info: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`ACTION_FLAGS` of a step's ``info`` that are set: ``action_injection``
    (the kinds found, a list), ``action_sanitized`` and ``action_truncated`` (``True``)."""
    return {
        name: list(value) if isinstance(value, tuple) else value for name in ACTION_FLAGS if (value := info.get(name))
    }


def flagged_turns(records: Sequence[Mapping[str, Any]]) -> dict[str, int] | None:
    """How many agent turns carried each of :data:`ACTION_FLAGS` (``injection``,
    ``sanitized``, ``truncated``) out of ``turns``; ``None`` when none did."""
    steps = [step for record in records for step in record.get("steps", ())]  # a record may keep no steps
    counts = {name.removeprefix("action_"): sum(1 for step in steps if step.get(name)) for name in ACTION_FLAGS}
    return {**counts, "turns": len(steps)} if any(counts.values()) else None


def must_not_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """How many dialogues tripped a check of their persona's ``must_not``: ``checked``
    (dialogues with checks), ``violating`` (with at least one hit), ``share``, and
    ``by_check`` (per check id: ``checked``, ``violating``); ``None`` when no dialogue
    had checks."""
    checked = [record["must_not"] for record in records if record.get("must_not")]
    if not checked:
        return None
    by_check: dict[str, dict[str, int]] = {}
    for entry in checked:
        for name in entry["checks"]:
            counts = by_check.setdefault(name, {"checked": 0, "violating": 0})
            counts["checked"] += 1
            counts["violating"] += bool(entry["hits"].get(name))
    violating = sum(bool(entry["hits"]) for entry in checked)
    return {"checked": len(checked), "violating": violating, "share": violating / len(checked), "by_check": by_check}


def run_dialogues(
    tasks: Sequence[Task],
    policy: Policy,
    make_env: Callable[[], EmpathyDialogueEnv],
    *,
    batch_size: int = 32,
    on_turns: Callable[[int], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Run the dialogues of ``tasks`` and yield each record (:func:`dialogue_record`) as
    soon as its dialogue ends (so not in task order).

    ``make_env`` builds the envs that serve as slots (at most ``batch_size``); give them a
    shared simulated user so that :func:`~empathy_gym.env.step_many` batches its calls.
    ``on_turns(played)`` is called after each round (one turn of every running dialogue)
    with the turns played so far.

    Raises:
        EvaluationError: ``batch_size`` < 1.
        TypeError: the policy returned the wrong number of utterances.
        Whatever the policy or the simulated user raises (records already yielded stay valid).
    """
    if batch_size < 1:
        raise EvaluationError(f"batch_size must be >= 1, got {batch_size}")
    slots = [make_env() for _ in range(min(batch_size, len(tasks)))]
    starts = [Start(task.seed, {"persona": task.persona}) for task in tasks]
    driver = _EvaluationDriver(tasks, policy)
    for ended in play(slots, starts, driver):
        if on_turns is not None:
            on_turns(driver.turns)
        yield from (run.record for run in ended)


class _EvaluationDriver(Driver[_Running]):
    """The evaluation's side of :func:`~empathy_gym.engine.play`: a chat policy and the dialogue records."""

    def __init__(self, tasks: Sequence[Task], policy: Policy):
        self.tasks, self.policy = tasks, policy
        self.turns = 0

    def begin(self, index: int, env: EmpathyDialogueEnv, info: dict[str, Any]) -> _Running:
        return _Running(self.tasks[index], info)

    def act(self, states: Sequence[_Running]) -> list[str]:
        conversations = [run.info["messages"] for run in states]
        actions = self.policy.act(conversations, [derive_seed(run.task.seed, run.info["turn"]) for run in states])
        if len(actions) != len(states):
            raise TypeError(
                f"policy {self.policy.name!r} returned {len(actions)} utterances for {len(states)} conversations"
            )
        return actions

    def record(self, state: _Running, env: EmpathyDialogueEnv, result: StepResult) -> bool:
        _, _, terminated, truncated, info = result
        state.info = info
        self.turns += 1
        appraisal = info["appraisal"]
        state.steps.append(
            {
                "utterance": info["utterance"],
                "change": appraisal["change"],
                "applied_change": info["emotion_change"],
                "emotion": info["emotion"],
                "thoughts": appraisal["thoughts"],
                "format_error": info["format_error"],
                **({"features": appraisal["features"]} if appraisal.get("features") else {}),
                **action_flags(info),
            }
        )
        if terminated or truncated:
            state.record = dialogue_record(state.task, info, state.steps, env.dialogue.emotions)
        return False


# -- the transcripts file --------------------------------------------------------------
def record_key(record: Mapping[str, Any]) -> tuple[str, int, int]:
    """``(persona_id, repeat, seed)`` of a transcript record."""
    return (str(record["persona_id"]), int(record["repeat"]), int(record["seed"]))


def read_transcripts(path: str | os.PathLike, *, repair: bool = False) -> dict[tuple[str, int, int], dict[str, Any]]:
    """The finished dialogues in a transcripts file, by ``(persona_id, repeat, seed)``
    (:func:`read_jsonl_records`, whose ``repair`` and errors these are)."""
    records: dict[tuple[str, int, int], dict[str, Any]] = {}
    for record in read_jsonl_records(path, KEY_FIELDS, repair=repair).values():
        records.setdefault(record_key(record), record)
    return records


# -- statistics ------------------------------------------------------------------------
def bootstrap_ci(
    values: Sequence[float] | np.ndarray, *, confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean (Efron & Tibshirani 1993,
    ch. 13), by ``scipy.stats.bootstrap`` (``method="percentile"``): the (1 - confidence)/2
    and (1 + confidence)/2 quantiles of the means of ``n_resamples`` resamples.

    Args:
        values: n >= 1 numbers (float64 after conversion), e.g. final emotions (0-100).
        confidence, n_resamples: in (0, 1), and >= 1.
        seed: seeds ``numpy.random.default_rng``; the same seed gives the same interval.

    Returns:
        ``(low, high)``, floats in the units of ``values``; ``(v, v)`` when all are ``v``.

    Raises:
        ValueError: no values, or ``confidence`` / ``n_resamples`` out of range.
    """
    data = np.asarray(values, dtype=np.float64).ravel()
    if data.size == 0:
        raise ValueError("bootstrap_ci: no values")
    if not 0 < confidence < 1:
        raise ValueError(f"bootstrap_ci: confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"bootstrap_ci: n_resamples must be >= 1, got {n_resamples}")
    if np.all(data == data[0]):  # no spread: the interval is the point (scipy would warn)
        return float(data[0]), float(data[0])
    from scipy.stats import bootstrap

    result = bootstrap(
        (data,),
        np.mean,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _group_stats(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    finals = [r["final_emotion"] for r in records]
    return {
        "dialogues": len(records),
        "sentient_score": float(np.mean(finals)),
        "successes": sum(r["termination"] == "success" for r in records),
        "failures": sum(r["termination"] == "failure" for r in records),
        "goodbyes": sum(r["termination"] == "goodbye" for r in records),
        "mean_turns": float(np.mean([r["turns"] for r in records])),
    }


def _breakdown(records: Sequence[Mapping[str, Any]], field_name: str, order: Sequence[str]) -> dict[str, Any]:
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        groups.setdefault(record[field_name], []).append(record)
    known = [k for k in order if k in groups] + sorted(k for k in groups if k not in order)
    return {key: _group_stats(groups[key]) for key in known}


def summarize(
    records: Sequence[Mapping[str, Any]], *, confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> dict[str, Any]:
    """The report of a run from its records (in task order, for a reproducible bootstrap).

    Returns a dict with:

    * ``sentient_score``: the mean final emotion (float, 0-100; SAGE's Sentient score);
    * ``ci``: ``{"low", "high", "confidence", "method", "resamples", "seed", "unit",
      "source"}``: a percentile bootstrap interval (:func:`bootstrap_ci`) over personas:
      each persona's mean over its repeats is one value (with one repeat, the dialogues
      themselves), so repeats of one persona are never treated as independent;
    * ``dialogues``, ``personas``; ``successes`` (ended at the success threshold),
      ``failures`` (ended below the failure threshold), ``goodbyes`` (the user said
      goodbye in between), ``max_turns`` (ran out of turns), the success and failure
      rates; ``mean_turns``;
    * ``by_hidden_intention``, ``by_character_type``: per group ``dialogues``,
      ``sentient_score``, ``successes``, ``failures``, ``goodbyes``, ``mean_turns`` (standard ids in
      the papers' order first, free-text intentions after, sorted);
    * ``must_not`` (only where personas have checks): :func:`must_not_summary`;
    * ``flagged_turns`` (only where an agent turn was flagged): :func:`flagged_turns`.

    Raises:
        ValueError: no records.
    """
    if not records:
        raise ValueError("summarize: no records")
    per_persona: dict[str, list[int]] = {}
    for record in records:
        per_persona.setdefault(record["persona_id"], []).append(record["final_emotion"])
    low, high = bootstrap_ci(
        [np.mean(v) for v in per_persona.values()], confidence=confidence, n_resamples=n_resamples, seed=seed
    )
    overall = _group_stats(records)
    n = overall["dialogues"]
    ended_max = sum(r["termination"] == "max_turns" for r in records)
    return {
        "sentient_score": overall["sentient_score"],
        "ci": {
            "low": low,
            "high": high,
            "confidence": confidence,
            "method": "percentile bootstrap",
            "resamples": n_resamples,
            "seed": seed,
            "unit": "persona",
            "source": BOOTSTRAP_SOURCE,
        },
        "dialogues": n,
        "personas": len(per_persona),
        "successes": overall["successes"],
        "failures": overall["failures"],
        "goodbyes": overall["goodbyes"],
        "max_turns": ended_max,
        "success_rate": overall["successes"] / n,
        "failure_rate": overall["failures"] / n,
        "mean_turns": overall["mean_turns"],
        "by_hidden_intention": _breakdown(records, "hidden_intention", list(INTENTIONS)),
        "by_character_type": _breakdown(records, "character_type", list(CHARACTER_TYPES)),
    } | {
        key: value
        for key, value in (("must_not", must_not_summary(records)), ("flagged_turns", flagged_turns(records)))
        if value
    }


# -- the plot --------------------------------------------------------------------------
def plot_trajectories(
    records: Sequence[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    success_emotion: int | None = 100,
    failure_below: int = 10,
    title: str | None = None,
) -> None:
    """Save a PNG of the emotion (0-100) per agent turn (0 = the opening): one thin line per
    dialogue coloured by how it ended, the mean in black (an ended dialogue keeps its final
    emotion in it), and the thresholds dashed (no success line when ``success_emotion`` is ``None``).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    colours = {"success": "tab:green", "failure": "tab:red", "goodbye": "tab:orange", "max_turns": "tab:gray"}
    longest = max(len(r["emotions"]) for r in records)
    padded = np.array(
        [r["emotions"] + [r["emotions"][-1]] * (longest - len(r["emotions"])) for r in records], dtype=np.float64
    )
    figure = Figure(figsize=(8, 5.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    alpha = max(0.12, min(0.8, 8 / len(records)))  # a few dialogues stand out, many blend
    for record in records:
        axes.plot(
            range(len(record["emotions"])),
            record["emotions"],
            color=colours.get(record["termination"], "tab:blue"),
            alpha=alpha,
            linewidth=0.8,
        )
    axes.plot(range(longest), padded.mean(axis=0), color="black", linewidth=2.5, label="mean")
    if success_emotion is not None:
        axes.axhline(
            success_emotion, color="tab:green", linestyle="--", linewidth=1, label=f"success ({success_emotion})"
        )
    axes.axhline(failure_below, color="tab:red", linestyle="--", linewidth=1, label=f"failure (< {failure_below})")
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.set(
        xlabel="agent turn",
        ylabel="emotion",
        ylim=(-2, 102),
        xlim=(0, longest - 1),
        title=title or f"emotion trajectories ({len(records)} dialogues)",
    )
    figure.legend(loc="outside lower center", ncols=3)
    figure.savefig(path)


# -- the benchmark ---------------------------------------------------------------------
@dataclass
class EvalResult:
    """What :func:`evaluate` returns.

    Attributes:
        report: :func:`summarize`'s dict plus ``config`` (the run configuration).
        records: the transcript records, in task order.
        out_dir: where the files went, or ``None``.
        resumed: dialogues taken from an existing transcripts file.
    """

    report: dict[str, Any]
    records: list[dict[str, Any]]
    out_dir: Path | None = None
    resumed: int = 0


def _describe(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {str(k): _describe(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return (
            f"<{len(value)} personas>"
            if all(isinstance(v, (Persona, Mapping)) for v in value)
            else [_describe(v) for v in value]
        )
    return getattr(value, "name", None) or type(value).__name__


def describe_user(user: str | Mapping[str, Any] | UserSpec | SimulatedUser) -> tuple[str, str]:
    """How a run records its simulated user: ``(user, appraisal_mode)``; ``user`` is a
    spec string as given, the ``--user`` form of a mapping or ``UserSpec``, or a ready
    user's class name.

    Raises:
        SpecError, TypeError: a bad spec (:func:`~empathy_gym.user.specs.as_user_spec`).
    """
    if isinstance(user, SimulatedUser):
        return type(user).__name__, str(getattr(user, "appraisal_mode", "free"))
    spec = as_user_spec(user)
    return (user if isinstance(user, str) else str(spec)), spec.appraisal_mode


@dataclass(frozen=True)
class EvalConfig:
    """How :func:`evaluate` plays and reports a run (everything but the policy and the
    personas). The fields that shape the dialogues are recorded in ``run.json`` and must
    match on resume.

    Attributes:
        user: a ``--user`` spec (``"rule"``, ``"openai:MODEL@URL,appraisal_mode=choice"``),
            a mapping of :class:`~empathy_gym.user.specs.UserSpec` fields or a ``UserSpec``
            (built and closed by the run), or a ready :class:`~empathy_gym.user.SimulatedUser`.
        difficulty: preset name, path or dict.
        protocol: ``"sage"`` (default), ``"rlver_training"``, a dict or an
            :class:`~empathy_gym.user.EmotionProtocol`.
        think: the policy writes ``<think>...</think>`` first; only the reply reaches the user.
        repeats: dialogues per persona (>= 1), each with its own seed.
        limit: the first ``limit`` personas only (>= 1; ``None``: all).
        seed: the run seed (int >= 0); it also seeds the bootstrap.
        batch_size: dialogues run at once (>= 1).
        max_tokens: new tokens per reply of model-backed policies; ``None``:
            :func:`~empathy_gym.evaluation.policies.reply_token_cap`; 0: no cap but the
            model's context, as SAGE.
        temperature, top_p: sampling settings of model-backed policies.
        system_prompt: the agent's system prompt (a ``str`` or ``{language: str}``);
            ``None``: SAGE's (:data:`~empathy_gym.env.SAGE_AGENT_SYSTEM_PROMPTS`) under
            the ``sage`` protocol, else the env's default.
        confidence, n_resamples: of the bootstrap interval (:func:`bootstrap_ci`).
    """

    user: str | Mapping[str, Any] | UserSpec | SimulatedUser = "rule"
    difficulty: Any = "moderate"
    protocol: Any = "sage"
    think: bool = False
    repeats: int = 1
    limit: int | None = None
    seed: int = 0
    batch_size: int = 32
    max_tokens: int | None = None
    temperature: float = 0.7
    top_p: float = 1.0
    system_prompt: str | Mapping[str, str] | None = None
    confidence: float = 0.95
    n_resamples: int = 10_000


def _run_record(personas: Any, config: EvalConfig, protocol: Any, policy: Any, policy_name: str) -> dict[str, Any]:
    """What ``run.json`` records of a run (and checks on resume)."""
    user_name, appraisal_mode = describe_user(config.user)
    system_prompt = config.system_prompt
    if system_prompt is None and protocol_name(protocol) == "sage":
        system_prompt = SAGE_AGENT_SYSTEM_PROMPTS
    return {
        "personas": _describe(personas),
        "policy": policy_name,
        "user": user_name,
        "appraisal_mode": appraisal_mode,
        "difficulty": _describe(config.difficulty),
        "protocol": dataclasses.asdict(protocol),
        "think": config.think,
        "seed": config.seed,
        "generation": {"max_tokens": config.max_tokens, **spec_sampling(policy, config.temperature, config.top_p)},
        "system_prompt": _describe(system_prompt),
    }


def evaluate(
    policy: str | Policy | Callable[..., Any],
    personas: PersonaSource | None = "sage",
    *,
    config: EvalConfig | None = None,
    out_dir: str | os.PathLike | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    on_turns: Callable[[int, int], None] | None = None,
    **options: Any,
) -> EvalResult:
    """Run the benchmark: one dialogue per persona and repeat, then the report.

    Args:
        policy: a spec (``"baseline:listener"``, ``"hf:PATH,adapter=DIR"``,
            ``"openai:MODEL@URL"``, ``"python:MODULE:ATTR"``), a
            :class:`~empathy_gym.evaluation.policies.Policy`, or a callable ``messages -> str``
            (:func:`~empathy_gym.evaluation.policies.make_policy`).
        personas: anything :func:`~empathy_gym.personas.load_personas` takes (default
            ``"sage"``: SAGE's 100 test profiles).
        config: an :class:`EvalConfig` (``None``: its defaults).
        out_dir: the run folder (:class:`~empathy_gym.evaluation.run_folder.RunFolder`),
            resumed when it holds this run; ``None``: nothing written.
        on_progress: called as ``on_progress(done, total)`` (dialogue counts) once before
            the first new dialogue (``done`` = those resumed) and after each one ends.
        on_turns: called as ``on_turns(played, at_most)`` after each round: the turns
            this run has played, and the most its dialogues can take (the protocol's
            ``max_turns`` each; dialogues that end early take fewer).
        **options: :class:`EvalConfig` fields, replacing ``config``'s
            (``evaluate(policy, "en", user="rule", limit=5)``).

    Returns:
        :class:`EvalResult`; ``report["sentient_score"]`` is the mean final emotion (0-100).

    Raises:
        PersonaError: an invalid persona bank (file, line, field).
        EvaluationError: a corrupt transcripts file, a run folder with another
            configuration, an ``out_dir`` that is a file, bad ``repeats``/``limit``/``batch_size``.
        SpecError: a malformed policy or user spec, or a policy's ``think_budget`` without
            ``think``. TypeError: ``user`` of another type,
            or an option that is not an :class:`EvalConfig` field.
        SimulatorError, BackendError: from the simulated user or the policy's backend;
            dialogues already finished stay in the transcripts.
    """
    config = dataclasses.replace(config or EvalConfig(), **options)
    config = dataclasses.replace(config, max_tokens=reply_token_cap(policy, config.max_tokens))
    if spec_think_budget(policy, config.max_tokens) is not None and not config.think:
        raise SpecError(
            f"{policy!r}: think_budget starts every reply inside <think>; evaluate with think=True (--think), "
            "else the user would read the thinking"
        )
    bank = load_personas(personas)
    tasks = plan_tasks(bank, repeats=config.repeats, seed=config.seed, limit=config.limit)
    protocol = resolve_protocol(config.protocol)
    policy_obj = None if isinstance(policy, str) else make_policy(policy)  # a spec loads only if needed
    recorded = _run_record(personas, config, protocol, policy, policy if policy_obj is None else policy_obj.name)
    folder = RunFolder(out_dir, recorded, TRANSCRIPTS, KEY_FIELDS) if out_dir is not None else None
    done = folder.done if folder is not None else {}
    todo = [task for task in tasks if task.key not in done]
    if on_progress is not None:
        on_progress(len(tasks) - len(todo), len(tasks))
    if todo:
        _play_tasks(
            todo,
            policy,
            policy_obj,
            bank,
            config,
            recorded,
            folder,
            done,
            lambda: on_progress(len(done), len(tasks)) if on_progress is not None else None,
            (lambda played: on_turns(played, len(todo) * protocol.max_turns)) if on_turns is not None else None,
        )
    records = [json.loads(json.dumps(done[task.key])) for task in tasks]
    report = summarize(records, confidence=config.confidence, n_resamples=config.n_resamples, seed=config.seed)
    report["config"] = {**recorded, "repeats": config.repeats, "limit": config.limit}
    if folder is not None:
        folder.write_report(report)
        plot_trajectories(
            records,
            folder.path / PLOT,
            success_emotion=protocol.success_emotion,
            failure_below=protocol.failure_below,
            title=f"{recorded['policy']} vs {recorded['user']}: Sentient score "
            f"{report['sentient_score']:.1f} "
            f"[{report['ci']['low']:.1f}, {report['ci']['high']:.1f}]",
        )
    return EvalResult(report, records, folder.path if folder is not None else None, len(tasks) - len(todo))


def _play_tasks(
    todo: Sequence[Task],
    policy: Any,
    policy_obj: Policy | None,
    bank: Sequence[Persona],
    config: EvalConfig,
    recorded: Mapping[str, Any],
    folder: RunFolder | None,
    done: dict[tuple[Any, ...], dict[str, Any]],
    progress: Callable[[], None],
    on_turns: Callable[[int], None] | None,
) -> None:
    """Play ``todo``'s dialogues and add each record to ``done`` (and the folder) as it
    ends (``progress()`` after each, ``on_turns(played)`` after each round); the user and
    a policy loaded from its spec are closed at the end."""
    session = Session(
        EmpathyDialogueEnv,
        personas=bank,
        difficulty=load_difficulty(config.difficulty),
        user=config.user,
        protocol=resolve_protocol(config.protocol),
        think=config.think,
        system_prompt=recorded["system_prompt"],
    )  # a user given ready is the caller's: the session does not close it
    owns_policy = policy_obj is None
    try:
        if owns_policy:
            policy_obj = make_policy(
                policy, max_tokens=config.max_tokens, temperature=config.temperature, top_p=config.top_p
            )
        if folder is not None:
            folder.start()  # once both have loaded
        if on_turns is not None:
            on_turns(0)
        for record in run_dialogues(todo, policy_obj, session.new_env, batch_size=config.batch_size, on_turns=on_turns):
            if folder is not None:  # adds it to folder.done, which is done
                where = f"dialogue {record['persona_id']!r} (repeat {record['repeat']}, seed {record['seed']})"
                folder.append([record], where=[where])
            else:
                done[record_key(record)] = record
            progress()
    finally:
        if folder is not None:
            folder.close()
        if owns_policy and policy_obj is not None:
            policy_obj.close()
        session.close()
