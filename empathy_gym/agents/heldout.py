"""Before/after evaluation of a trained policy on held-out personas (docs/training.md).

``heldout.bank`` is split with :func:`~empathy_gym.personas.split_personas`; the policy
trains on one part and is evaluated on the other before the first step and after the
last, with the same dialogues and seeds both times (common random numbers), so the
difference is paired persona by persona. Personas are the unit: a persona's repeats are
averaged first. Scores: the Sentient score (SAGE, arXiv 2505.02847, section 3) with
percentile bootstrap intervals over personas (Efron & Tibshirani 1993, ch. 13).

Files under ``<output_dir>/heldout/``: ``train_personas.jsonl``, ``test_personas.jsonl``,
``before.jsonl``, ``after.jsonl`` (``*_judge.jsonl``: the second judge's; ``*_judges<i>.jsonl``:
``heldout.judges[i]``'s), ``report.json``
and ``report.txt``, ``capabilities_{before,after}.json`` with ``heldout.capabilities``, and
``run.json``: the settings each file was made with (:func:`evaluation_settings`). A finished
"before" file is reused on ``--resume`` when ``run.json`` holds this run's settings for it,
as eval's and replay's run folders are (:mod:`~empathy_gym.evaluation.run_folder`); an
"after" file only when made at the same step too (a finished run resumed to play a judge
added since plays that judge alone).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from empathy_gym.agents.budget_forcing import with_think_budget
from empathy_gym.agents.callbacks import TrainerCallback, TrainingState
from empathy_gym.agents.config import HELDOUT_DIR, training_split_path
from empathy_gym.agents.envs import make_session
from empathy_gym.agents.monitors import replies_of, reply_monitors
from empathy_gym.evaluation import jsonl
from empathy_gym.evaluation.benchmark import bootstrap_ci, plan_tasks, run_dialogues, summarize
from empathy_gym.evaluation.policies import GeneratorPolicy
from empathy_gym.evaluation.run_folder import RUN_CONFIG, append_records, differences, write_json
from empathy_gym.personas import Persona, load_personas, personas_text, split_personas
from empathy_gym.user.specs import as_user_spec

log = logging.getLogger(__name__)

#: What the table can and cannot claim, printed under it: the start, then what the
#: training user is (by its backend), then the end.
CAVEAT = (
    "What this shows: whether training moved the policy's score on personas it never trained on, "
    "beyond what the sampling noise of these dialogues explains (the interval). What it does not show: "
    "empathy. The simulated user here is {user}; a gain against it "
    "means the policy learnt what that model rewards, not that an LLM judge or a person would feel "
    "better understood. Check with a second judge (heldout.user) or an LLM user (env.kwargs.user) "
    "before calling it a result."
)
USER_KINDS = {
    "rule": "the rule-based stand-in (a linear model of surface features fitted to SAGE's LLM appraisals, "
    "which it matches on the sign of ~76% of held-out turns within a simulator family and ~65% across families)",
    "distilled": "a small appraiser distilled from SAGE's LLM simulators (a head on a 135M model's states and "
    "the rule user's features, which agrees with an unseen simulator family only in part: "
    "benchmarks/results/distilled_agreement.txt)",
}


def caveat(config: Any) -> str:
    """:data:`CAVEAT` for the training user of ``config``: :data:`USER_KINDS` by its backend, else
    an LLM user (or a user given in code) named by its spec."""
    spec = config.env.user_spec()
    if spec is None:
        return CAVEAT.format(user="a SimulatedUser given in code")
    backend = spec.backend if isinstance(spec.backend, str) else "a ready backend"
    return CAVEAT.format(user=USER_KINDS.get(backend, f"an LLM playing the user ({spec})"))


def _user_label(config: Any) -> str:
    spec = config.env.user_spec()
    return str(spec) if spec is not None else "a ready SimulatedUser"


#: Printed (and logged) when the training user's score rose and the second judge's fell.
DIVERGE = (
    "WARNING: the training user's score rose (its interval excludes 0) while the second judge's fell: "
    "the policy may have learnt what its judge pays rather than anything the second judge values. "
    "Read the after-training transcripts (after.jsonl) before calling this a gain."
)


def split_bank(config: Any) -> tuple[tuple[Persona, ...], tuple[Persona, ...]]:
    """``(train, test)`` personas of ``config.heldout`` (see :class:`HeldoutConfig`).

    Raises:
        PersonaError: the bank does not load (file, line, field).
        ValueError: a split that leaves a part empty.
    """
    held = config.heldout
    return split_personas(load_personas(held.bank), held.test_fraction, seed=held.split_seed)


def prepare(config: Any) -> tuple[Any, tuple[Persona, ...]]:
    """Write the split under ``<output_dir>/heldout/``; return the config to train with (a
    copy whose ``env.personas`` is the training part; ``config`` itself is left as it is)
    and the held-out personas. Without ``heldout.bank``: ``(config, ())``.

    Raises:
        PersonaError, ValueError: as :func:`split_bank`.
        FileExistsError: the folder already holds another split (another run's, with
            another bank or seed), which is kept: nothing is written.
    """
    import dataclasses

    if config.heldout.bank is None:
        return config, ()
    train, test = split_bank(config)
    train_path = training_split_path(config)
    parts = {train_path: train, train_path.parent / "test_personas.jsonl": test}
    for path, personas in parts.items():  # all checked before any is written
        if path.exists() and path.read_text(encoding="utf-8") != personas_text(personas):
            raise FileExistsError(
                f"{path} holds another split of held-out personas (another run's: heldout.bank, "
                "test_fraction or split_seed differ); it is kept. Resume that run with its own recipe, "
                "or choose another output_dir"
            )
    train_path.parent.mkdir(parents=True, exist_ok=True)
    for path, personas in parts.items():
        if not path.exists():
            _write_atomically(path, personas_text(personas))
    return dataclasses.replace(config, env=dataclasses.replace(config.env, personas=str(train_path))), test


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in its folder (several training
    processes write the same split: a reader sees the whole file or none)."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, delete=False, suffix=".tmp") as handle:
        handle.write(text)
    os.replace(handle.name, path)


def play(
    state: TrainingState,
    personas: Sequence[Persona],
    *,
    user: Any = None,
    on_dialogue: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """Play ``heldout.repeats`` dialogues per persona with the current policy (``state``'s
    sampler) in the training env's settings (``user``: another simulated user); returns the
    records in task order. The seeds depend only on ``heldout.seed``, the persona and the
    repeat (:func:`~empathy_gym.evaluation.benchmark.dialogue_seed`): two calls play the same
    dialogues.
    """
    config = state.config
    held = config.heldout
    tasks = plan_tasks(list(personas), repeats=held.repeats, seed=held.seed)
    judge = {} if user is None else {"user": user}  # the second judge plays the same dialogues
    count = min(held.batch_size, len(tasks))
    generator = state.sampler(max_batch_size=held.batch_size, reuse_kv=False)
    sampler = with_think_budget(generator, state.tokenizer, config.generation)
    policy = GeneratorPolicy(sampler, state.tokenizer, name="policy under training")
    done = {}
    with make_session(config, config.generation.think, personas=list(personas), **judge) as session:
        slots = iter(session.envs(count))
        for record in run_dialogues(tasks, policy, lambda: next(slots), batch_size=held.batch_size):
            done[(record["persona_id"], record["repeat"])] = record
            if on_dialogue is not None:
                on_dialogue()
    return [done[(t.persona.id, t.repeat)] for t in tasks]


def per_persona(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each persona's mean final emotion (0-100) over its repeats, in first-seen order."""
    finals: dict[str, list[int]] = {}
    for record in records:
        finals.setdefault(record["persona_id"], []).append(record["final_emotion"])
    return {persona: float(np.mean(values)) for persona, values in finals.items()}


def paired_difference(
    before: Sequence[dict[str, Any]],
    after: Sequence[dict[str, Any]],
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """The mean over personas of (after - before) with a percentile bootstrap interval
    over personas (:func:`~empathy_gym.evaluation.benchmark.bootstrap_ci`).

    Args:
        before, after: dialogue records (``persona_id``, ``final_emotion`` in [0, 100])
            of the same personas.
        confidence: in (0, 1); n_resamples: >= 1; seed: the bootstrap's random state.

    Returns:
        ``{"difference", "low", "high", "confidence", "personas", "per_persona"}``, the
        first three in emotion points (-100 to 100), ``per_persona`` mapping each id to
        its difference.

    Raises:
        ValueError: the two sets hold different personas, or none.
    """
    first, second = per_persona(before), per_persona(after)
    if set(first) != set(second) or not first:
        raise ValueError(f"paired_difference: before has personas {sorted(first)}, after {sorted(second)}")
    differences = {p: second[p] - first[p] for p in first}
    mean, low, high = bootstrap_mean(
        list(differences.values()), confidence=confidence, n_resamples=n_resamples, seed=seed
    )
    return {
        "difference": mean,
        "low": low,
        "high": high,
        "confidence": confidence,
        "personas": len(differences),
        "per_persona": differences,
    }


def bootstrap_mean(
    values: Sequence[float], *, confidence: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean, low, high)`` of ``values`` (one per persona) with a percentile bootstrap
    interval (:func:`~empathy_gym.evaluation.benchmark.bootstrap_ci`)."""
    low, high = bootstrap_ci(values, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return float(np.mean(values)), low, high


def judges_gap(
    training: Mapping[str, Any],
    judge: Mapping[str, Any],
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """The mean over personas of (training user's after - before) - (judge's after -
    before), in emotion points, with a bootstrap interval (:func:`bootstrap_mean`).
    ``training``, ``judge``: :func:`paired_difference` results over the same personas.

    Returns:
        ``{"gap", "low", "high", "confidence", "diverge"}``; ``diverge``: the training
        user's interval is above 0 while the judge's point difference is below 0.
    """
    gaps = [training["per_persona"][p] - judge["per_persona"][p] for p in training["per_persona"]]
    gap, low, high = bootstrap_mean(gaps, confidence=confidence, n_resamples=n_resamples, seed=seed)
    diverge = training["low"] > 0 and judge["difference"] < 0
    return {"gap": gap, "low": low, "high": high, "confidence": confidence, "diverge": diverge}


def feature_shift(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Where the change in score came from, by the rule user's feature groups (each
    step's ``features``, :meth:`empathy_gym.user.rule_model.AppraisalModel.contributions`).

    Returns, per group, the mean over dialogues of the sum over a dialogue's steps, after
    minus before (emotion points), largest first; ``{}`` when the records carry no
    features (an LLM user).
    """

    def totals(records: Sequence[dict[str, Any]]) -> dict[str, float]:
        sums: dict[str, float] = {}
        for record in records:
            for step in record.get("steps", ()):
                for group, points in step.get("features", {}).items():
                    sums[group] = sums.get(group, 0.0) + points
        return {group: value / max(len(records), 1) for group, value in sums.items()}

    first, second = totals(before), totals(after)
    shift = {group: second.get(group, 0.0) - first.get(group, 0.0) for group in {*first, *second}}
    return dict(sorted(shift.items(), key=lambda item: (-abs(item[1]), item[0])))


def _score_lines(
    first: Mapping[str, Any], second: Mapping[str, Any], difference: Mapping[str, Any], steps: int, level: str
) -> list[str]:
    """The before / after / difference rows of one judge's table."""
    excludes = difference["low"] > 0 or difference["high"] < 0
    verdict = (
        ("a gain" if difference["difference"] > 0 else "a loss") + f": the {level} interval excludes 0"
        if excludes
        else f"no clear change: the {level} interval contains 0"
    )
    return [
        f"{'before training':26}{first['sentient_score']:>15.2f}   "
        f"[{first['ci']['low']:.2f}, {first['ci']['high']:.2f}]",
        f"{f'after {steps} steps':26}{second['sentient_score']:>15.2f}   "
        f"[{second['ci']['low']:.2f}, {second['ci']['high']:.2f}]",
        f"{'difference (paired)':26}{difference['difference']:>+15.2f}   "
        f"[{difference['low']:+.2f}, {difference['high']:+.2f}]   {verdict}",
    ]


def report(
    config: Any,
    before: Sequence[dict[str, Any]],
    after: Sequence[dict[str, Any]],
    steps: int,
    judge: tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]] | None = None,
    trend: Mapping[str, Mapping[str, float]] | None = None,
    capabilities: tuple[Mapping[str, Mapping[int, float]], Mapping[str, Mapping[int, float]]] | None = None,
    judges: Sequence[tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]]] = (),
) -> dict[str, Any]:
    """The before/after summaries, the paired difference, and the table as ``text``;
    with ``judge`` (the second judge's before and after records, ``heldout.user``) its
    summaries and difference too, and the gap between the judges (:func:`judges_gap`);
    with ``judges`` (the before and after records of each of ``heldout.judges``, in order)
    each one's summaries and difference, kept as ``judges`` (a list of ``{"user", "before",
    "after", "difference"}``);
    with ``trend`` (:func:`training_trend`) a line on how the run moved during training,
    kept as ``training``; with ``capabilities`` (lm-eval scores before and after, item by
    item) their paired table (:func:`~empathy_gym.evaluation.capabilities.compare`), kept as
    ``capabilities``."""
    held = config.heldout
    kwargs = {"confidence": held.confidence, "n_resamples": held.n_resamples, "seed": held.seed}
    first, second = summarize(list(before), **kwargs), summarize(list(after), **kwargs)
    difference = paired_difference(before, after, **kwargs)
    level = f"{held.confidence:.0%}"
    lines = [
        f"Held-out evaluation: {difference['personas']} personas of the {held.bank!r} bank that training never "
        f"saw (split_personas, stratified by hidden intention, test_fraction {held.test_fraction}, "
        f"seed {held.split_seed}), {held.repeats} dialogues each, the same dialogues and sampling seeds before "
        f"and after; simulated user: {_user_label(config)}.",
        f"{'':26}{'Sentient score':>15}   {level} interval (bootstrap over personas)",
        *_score_lines(first, second, difference, steps, level),
        f"(Sentient score: mean final emotion, 0-100, start {before[0]['initial_emotion']}; "
        f"successes {first['successes']} -> {second['successes']}, failures {first['failures']} -> "
        f"{second['failures']} of {first['dialogues']} dialogues)",
    ]
    result = {
        "before": first,
        "after": second,
        "difference": difference,
        "steps": steps,
        "excludes_zero": difference["low"] > 0 or difference["high"] < 0,
    }
    if judge is not None:
        result["judge"] = {
            "user": str(as_user_spec(held.user)),
            "before": summarize(list(judge[0]), **kwargs),
            "after": summarize(list(judge[1]), **kwargs),
            "difference": paired_difference(judge[0], judge[1], **kwargs),
        }
        result["judges_gap"] = judges_gap(difference, result["judge"]["difference"], **kwargs)
        lines += _judge_lines(result["judge"], result["judges_gap"], steps, level)
    if judges:
        result["judges"] = [
            {
                "user": str(as_user_spec(spec)),
                "before": summarize(list(first_records), **kwargs),
                "after": summarize(list(second_records), **kwargs),
                "difference": paired_difference(first_records, second_records, **kwargs),
            }
            for spec, (first_records, second_records) in zip(held.judges, judges, strict=True)
        ]
        lines.append("More judges (heldout.judges; the same personas and seeds, their own dialogues):")
        for other in result["judges"]:
            lines += [f"  {other['user']}"] + _score_lines(
                other["before"], other["after"], other["difference"], steps, level
            )
    monitors = {"before": record_monitors(before), "after": record_monitors(after)}
    result["monitors"] = monitors
    lines.append(_monitor_line(monitors))
    shift = feature_shift(before, after)
    if shift:
        largest = ", ".join(f"{group} {points:+.2f}" for group, points in list(shift.items())[:5])
        lines.append(
            f"Where the change came from (the training user's appraisal by feature group, points per "
            f"dialogue, after - before; largest first): {largest}."
        )
    if trend:
        result["training"] = dict(trend)
        lines.append(_trend_line(trend))
    if capabilities is not None:
        from empathy_gym.evaluation.capabilities import compare, table_text

        margin = held.capabilities_margin
        table = compare(
            *capabilities, confidence=held.confidence, margin=margin, n_resamples=held.n_resamples, seed=held.seed
        )
        result["capabilities"] = table
        lines.append(
            "Capabilities (lm-eval, greedy, the same items before and after; heldout.capabilities):\n"
            + table_text(table, confidence=held.confidence, margin=margin)
        )
    lines.append(caveat(config))
    return result | {"feature_shift": shift, "text": "\n".join(lines)}


def record_monitors(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The reward-hacking monitors (:func:`~empathy_gym.agents.monitors.reply_monitors`)
    of the policy's replies in dialogue records (their ``messages`` and ``language``)."""
    return reply_monitors(
        [reply for record in records for reply in replies_of(record.get("messages", ()), record.get("language", "en"))]
    )


def _monitor_line(monitors: Mapping[str, Mapping[str, float]]) -> str:
    """The held-out replies' monitors, before -> after, in one line."""
    names = {
        "reply_words_mean": "words/reply",
        "distinct_2": "distinct-2",
        "self_repeat_share": "repeat themselves",
        "parrot_share": "parrot the user",
        "wrong_script_share": "wrong script",
        "nonword_share": "non-words",
        "injection_share": "injection-like",
    }
    parts = [
        f"{label} {monitors['before'][f'monitor/{name}']:.2f} -> {monitors['after'][f'monitor/{name}']:.2f}"
        for name, label in names.items()
    ]
    return (
        "The held-out replies (reward-hacking monitors, empathy_gym.agents.monitors; shares of replies "
        f"unless said, before -> after): {'; '.join(parts)}."
    )


def _judge_lines(judge: Mapping[str, Any], gap: Mapping[str, Any], steps: int, level: str) -> list[str]:
    """The second judge's rows and the gap row (with a warning when the judges diverge)."""
    lines = [
        f"Second judge (heldout.user = {judge['user']}; the same personas and seeds, its own dialogues):",
        *_score_lines(judge["before"], judge["after"], judge["difference"], steps, level),
        f"{'gap (training - judge)':26}{gap['gap']:>+15.2f}   [{gap['low']:+.2f}, {gap['high']:+.2f}]   "
        f"how much more the training user's difference is than the second judge's",
    ]
    if gap["diverge"]:
        lines.append(DIVERGE)
    return lines


#: The per-step metrics the report follows through training: (key, label, unit).
TREND_KEYS = (
    ("reward/mean_turn_reward", "reward per reply", ""),
    ("judge/change_mean", "second judge's change per reply", " points"),
    ("judge/train_change_mean", "training user's change on the same replies", " points"),
    ("monitor/distinct_2", "distinct-2", ""),
    ("monitor/reference_nll", "reference NLL", " nats/token"),
)


def training_trend(path: Path, span: int = 5) -> dict[str, dict[str, float]]:
    """The mean of each :data:`TREND_KEYS` metric over the first and the last ``span``
    steps of a run's ``metrics.jsonl`` (``{key: {"first": x, "last": y}}``; keys the run
    did not log, or logged only as NaN, are left out), and ``judge/diverging_steps``
    (``{"count": n}``) where the second judge ran; ``{}`` without the file."""
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in jsonl.lines(path.read_text(encoding="utf-8")) if line.strip()]
    trend = {}
    for key, _, _ in TREND_KEYS:
        values = [row[key] for row in rows if isinstance(row.get(key), (int, float))]
        if values:
            trend[key] = {"first": float(np.mean(values[:span])), "last": float(np.mean(values[-span:]))}
    if "judge/change_mean" in trend:
        trend["judge/diverging_steps"] = {"count": float(sum(row.get("judge/diverging") == 1.0 for row in rows))}
    return trend


def _trend_line(trend: Mapping[str, Mapping[str, float]]) -> str:
    parts = [
        f"{label} {trend[key]['first']:.2f} -> {trend[key]['last']:.2f}{unit}"
        for key, label, unit in TREND_KEYS
        if key in trend
    ]
    if "judge/diverging_steps" in trend:
        parts.append(
            f"steps where the judges diverged (judge/diverging) {int(trend['judge/diverging_steps']['count'])}"
        )
    return f"During training (metrics.jsonl; mean of the first 5 steps -> the last 5): {'; '.join(parts)}."


def _write_records(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Write ``records`` as JSON Lines, atomically (a synced temporary file renamed over ``path``)."""
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    append_records(tmp, records)
    os.replace(tmp, path)


#: ``heldout`` fields that change the report, not what is played or measured
REPORT_ONLY = ("confidence", "n_resamples", "capabilities_margin")
#: ``heldout`` fields that change what lm-eval measures (beside the policy's model and dtype)
CAPABILITY_FIELDS = ("capabilities", "capabilities_limit", "seed", "batch_size")


def evaluation_settings(config: Any, kind: str = "dialogues", index: int = 0) -> dict[str, Any] | None:
    """What a held-out file depends on, as ``{"field.name": value}`` (not the optimiser's
    settings nor ``total_steps``: a resumed run may change those).

    Args:
        kind: ``"dialogues"`` (the training user's): the policy's model and dtype, the
            ``generation`` fields the held-out sampler reads (not the engine's), every
            ``env`` field, and the ``heldout`` fields but :data:`REPORT_ONLY`, the
            capabilities' and the judges'; ``"judge"``: those and ``heldout.user``;
            ``"judges"``: those and ``heldout.judges[index]``; ``"capabilities"``: the
            model and dtype and :data:`CAPABILITY_FIELDS`.

    Returns:
        The settings, or ``None`` for a config that is not plain data (a ready user
        object in ``env.kwargs``).
    """
    from empathy_gym.agents.config import to_dict

    try:
        record = json.loads(json.dumps(to_dict(config)))
    except (TypeError, ValueError):  # omegaconf's errors are ValueErrors
        return None
    settings = {f"policy.{name}": record["policy"][name] for name in ("model", "dtype")}
    held = record["heldout"]
    if kind == "capabilities":
        return settings | {f"heldout.{name}": held[name] for name in CAPABILITY_FIELDS}
    settings |= {
        f"generation.{name}": value
        for name, value in record["generation"].items()
        if name != "engine" and not name.startswith("vllm")
    }
    settings |= {f"env.{name}": value for name, value in record["env"].items() if name != "personas"}
    skipped = {*REPORT_ONLY, *CAPABILITY_FIELDS[:2], "judges", *(("user",) if kind != "judge" else ())}
    settings |= {f"heldout.{name}": value for name, value in held.items() if name not in skipped}
    return settings | ({f"heldout.judges[{index}]": held["judges"][index]} if kind == "judges" else {})


def evaluation_file(name: str, judge: str | int | None = None) -> str:
    """The file of the evaluation ``name`` ("before"/"after") under ``heldout/``: with the
    training user (``judge`` ``None``) ``<name>.jsonl``, with the second judge (``"user"``)
    ``<name>_judge.jsonl``, with ``heldout.judges[i]`` (``i``) ``<name>_judges<i>.jsonl``."""
    if judge is None:
        return f"{name}.jsonl"
    return f"{name}_judge.jsonl" if judge == "user" else f"{name}_judges{judge}.jsonl"


def capabilities_file(name: str) -> str:
    """The file of the lm-eval scores of the evaluation ``name`` ("before"/"after") under ``heldout/``."""
    return f"capabilities_{name}.json"


def judge_settings(config: Any, judge: str | int | None = None) -> dict[str, Any] | None:
    """:func:`evaluation_settings` of the file :func:`evaluation_file` names for ``judge``."""
    if judge is None:
        return evaluation_settings(config)
    return evaluation_settings(config, "judge") if judge == "user" else evaluation_settings(config, "judges", judge)


def evaluation_files(config: Any, name: str) -> dict[str, dict[str, Any] | None]:
    """Every file the evaluation ``name`` ("before"/"after") of ``config`` writes under
    ``heldout/``, with the settings it is made with (what ``run.json`` records for it):
    the training user's, the second judge's, each of ``heldout.judges``' and the
    capabilities'."""
    held = config.heldout
    judges = [None, *(["user"] if held.user is not None else []), *range(len(held.judges))]
    files = {evaluation_file(name, judge): judge_settings(config, judge) for judge in judges}
    if held.capabilities:
        files[capabilities_file(name)] = evaluation_settings(config, "capabilities")
    return files


def saved_settings(folder: Path) -> dict[str, Any] | None:
    """A ``heldout/`` folder's ``run.json``: ``{file name: the settings it was made with}``;
    ``None`` when there is none, ``{}`` for one that does not read (it records nothing)."""
    try:
        saved = json.loads((folder / RUN_CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _made_at(settings: dict[str, Any] | None, name: str, state: TrainingState) -> dict[str, Any] | None:
    """What ``run.json`` records for a file of the evaluation ``name``: an "after" file
    depends on the policy's training too, so its settings name the step it was made at."""
    return settings if settings is None or name == "before" else {**settings, "step": state.step}


def _read_records(path: Path, expected: int) -> list[dict[str, Any]] | None:
    """The records of a finished evaluation file, or ``None`` (missing, or cut short)."""
    if not path.exists():
        return None
    try:
        records = [json.loads(line) for line in jsonl.lines(path.read_text(encoding="utf-8")) if line.strip()]
    except json.JSONDecodeError:
        return None
    return records if len(records) == expected else None


class HeldoutEvaluation(TrainerCallback):
    """Runs the before and after evaluations of a training run and writes the report
    (:attr:`report`, also ``trainer.heldout_report``); a trainer whose config sets
    ``heldout.bank`` adds one.

    Args:
        config: a :class:`~empathy_gym.agents.config.TrainerConfig` with ``heldout.bank``
            set, passed through :func:`prepare`.
        progress: show a progress bar (tqdm) over the evaluation's dialogues.

    Attributes:
        report: the report (:func:`report`) once :meth:`on_train_end` ran, else ``None``.
    """

    def __init__(self, config: Any, *, progress: bool = True):
        self.config = config
        self.folder = Path(self.config.output_dir) / HELDOUT_DIR
        self.personas = split_bank(self.config)[1]
        self.progress = progress
        held = self.config.heldout
        #: the judges besides the training user: "user" (the second judge), then each index of heldout.judges
        self.judges: list[str | int] = (["user"] if held.user is not None else []) + list(range(len(held.judges)))
        self.before: list[dict[str, Any]] | None = None
        self.before_judges: dict[str | int, list[dict[str, Any]]] = {}
        self.read_back = 0  # dialogues of the evaluation before training read back from an earlier run
        self.capabilities_before: dict[str, dict[int, float]] | None = None
        self.report: dict[str, Any] | None = None
        self._trained = False  # a step trained in this process (on_step_end)

    def on_train_begin(self, state: TrainingState) -> None:
        """Play (or read back) the evaluation before training (and each judge's)."""
        started, self.read_back = time.perf_counter(), 0
        self.before = self.run("before", state)
        self.before_judges = {judge: self.run("before", state, judge=judge) for judge in self.judges}
        self.capabilities_before = self.capabilities("before", state)
        played = f"{len(self.before)} dialogues"
        if self.judges == ["user"]:
            played += " and as many with the second judge"
        elif self.judges:
            played += f" and as many with each of {len(self.judges)} more judges"
        if self.read_back == len(self.before) * (1 + len(self.judges)):  # nothing played: no time to go by
            log.info("held-out evaluation before training: %s read back from %s", played, self.folder)
            return
        log.info(
            "held-out evaluation before training: %s in %.0f s (the one after training takes about as long); "
            "now %d training steps",
            played,
            time.perf_counter() - started,
            self.config.total_steps,
        )

    def on_train_end(self, state: TrainingState) -> None:
        """Play the evaluation after training and write the report (:attr:`report`); warn
        when the judges diverge (:data:`DIVERGE`)."""
        before = self.before if self.before is not None else self.run("before", state)
        judged = {}
        for judge in self.judges:
            judge_before = self.before_judges.get(judge) or self.run("before", state, judge=judge)
            judged[judge] = (judge_before, self.run("after", state, judge=judge))
        capabilities = None
        if self.config.heldout.capabilities:
            capabilities_before = self.capabilities_before or self.capabilities("before", state)
            capabilities = (capabilities_before, self.capabilities("after", state))
        self.report = self.finish(
            before,
            self.run("after", state),
            state.step,
            judge=judged.pop("user", None),
            capabilities=capabilities,
            judges=list(judged.values()),
        )
        if self.report.get("judges_gap", {}).get("diverge"):
            log.warning(DIVERGE)

    @property
    def dialogues(self) -> int:
        return len(self.personas) * self.config.heldout.repeats

    def run(self, name: str, state: TrainingState, *, judge: str | int | None = None) -> list[dict[str, Any]]:
        """Play the evaluation ``name`` ("before" or "after") with the current policy
        (``state``'s sampler) and the training user (``judge`` ``None``), the second judge
        (``"user"``: ``heldout.user``) or ``heldout.judges[judge]`` (an index), and write
        ``<name>.jsonl`` (``<name>_judge.jsonl``, ``<name>_judges<index>.jsonl``); a
        finished file is read back instead of replayed where :meth:`_may_read_back` says so."""
        from tqdm.auto import tqdm

        from empathy_gym.agents.console import tolerant

        held = self.config.heldout
        if judge is None:
            user, label = None, ""
        elif judge == "user":
            user, label = held.user, ", second judge"
        else:
            user = held.judges[judge]
            label = f", judge {as_user_spec(user)}"
        path = self.folder / evaluation_file(name, judge)
        settings = _made_at(judge_settings(self.config, judge), name, state)
        if self._may_read_back(name, path, settings):
            records = _read_records(path, self.dialogues)
            if records is not None:
                self.read_back += len(records)
                return records
        self.folder.mkdir(parents=True, exist_ok=True)
        with tqdm(
            total=self.dialogues,
            desc=f"held-out evaluation ({name}{label})",
            disable=not self.progress,
            dynamic_ncols=True,
            # no time left: the dialogues play together, so the first to end says nothing of the rest
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}]",
            file=tolerant(sys.stderr),
        ) as bar:
            self._forget([path.name])  # a crash while it is rewritten must not leave it marked
            records = play(state, self.personas, user=user, on_dialogue=lambda: bar.update(1))
        _write_records(path, records)
        self._mark(path, settings)
        return records

    def capabilities(self, name: str, state: TrainingState) -> dict[str, dict[int, float]] | None:
        """The policy's lm-eval scores now (``heldout.capabilities``;
        :func:`~empathy_gym.evaluation.capabilities.measure`), written to
        ``capabilities_<name>.json``; a finished file is read back where
        :meth:`_may_read_back` says so. ``None`` with no task named."""
        held = self.config.heldout
        if not held.capabilities:
            return None
        path = self.folder / capabilities_file(name)
        settings = _made_at(evaluation_settings(self.config, "capabilities"), name, state)
        if path.exists() and self._may_read_back(name, path, settings):
            saved = json.loads(path.read_text(encoding="utf-8"))
            return {task: {int(item): score for item, score in items.items()} for task, items in saved.items()}
        from empathy_gym.evaluation.capabilities import measure

        self._forget([path.name])
        was_training = state.model.training
        try:
            scores = measure(
                state.model,
                state.tokenizer,
                held.capabilities,
                limit=held.capabilities_limit,
                batch_size=held.batch_size,
                seed=held.seed,
            )
        finally:
            state.model.train(was_training)
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(path, scores)
        self._mark(path, settings)
        return scores

    def _may_read_back(self, name: str, path: Path, settings: dict[str, Any] | None) -> bool:
        """A "before" file may be read back when it is :meth:`_current`; an "after" file
        only when ``run.json`` records it made with ``settings`` at this step and no step
        has trained since (:meth:`on_step_end` forgets it): the same policy, as in a
        finished run resumed to play a judge added since."""
        if name == "before":
            return self._current(path, settings)
        return settings is not None and path.exists() and (saved_settings(self.folder) or {}).get(path.name) == settings

    def _current(self, path: Path, settings: dict[str, Any] | None) -> bool:
        """Whether the file at ``path`` may be read back: ``run.json`` holds ``settings``
        for it (a folder written before ``run.json`` existed: yes). Logs the fields that
        differ when it may not."""
        saved = saved_settings(self.folder)
        if settings is None or saved is None or not path.exists():
            return True
        made_with = saved.get(path.name)
        if made_with == settings:
            return True
        changed = differences(made_with, settings) if isinstance(made_with, dict) else ["unknown"]
        log.warning("%s was made with other settings (%s); it is made again", path, "; ".join(changed))
        return False

    def on_step_end(self, state: TrainingState, step: int, trajectories: Sequence[Any]) -> None:
        """The policy changed: forget the marks of the evaluations after training, so that
        none is read back for another policy (a retrained or continued run), whatever its step."""
        if not self._trained:
            self._trained = True
            made = saved_settings(self.folder) or {}
            self._forget([name for name in made if name.startswith("after") or name == capabilities_file("after")])

    def _forget(self, names: Sequence[str]) -> None:
        """Remove ``names`` from ``run.json`` (their files are made again, not read back)."""
        saved = saved_settings(self.folder)
        if saved and any(name in saved for name in names):
            write_json(self.folder / RUN_CONFIG, {k: v for k, v in saved.items() if k not in names})

    def _mark(self, path: Path, settings: dict[str, Any] | None) -> None:
        """Record in ``run.json`` the settings the file at ``path`` was just written with
        (after the file: a crash between the two leaves a file that is made again)."""
        if settings is None:
            return
        write_json(self.folder / RUN_CONFIG, {**(saved_settings(self.folder) or {}), path.name: settings})

    def finish(
        self,
        before: Sequence[dict[str, Any]],
        after: Sequence[dict[str, Any]],
        steps: int,
        judge: tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]] | None = None,
        capabilities: tuple[Mapping[str, Mapping[int, float]], Mapping[str, Mapping[int, float]]] | None = None,
        judges: Sequence[tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]]] = (),
    ) -> dict[str, Any]:
        """Write ``report.json`` and ``report.txt`` for a policy trained ``steps`` steps;
        returns the report (:func:`report`)."""
        trend = training_trend(Path(self.config.output_dir) / "metrics.jsonl")
        result = report(
            self.config, before, after, steps, judge=judge, trend=trend, capabilities=capabilities, judges=judges
        )
        (self.folder / "report.txt").write_text(result["text"] + "\n", encoding="utf-8")
        saved = {k: v for k, v in result.items() if k != "text"}
        (self.folder / "report.json").write_text(
            json.dumps(saved, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        return result
