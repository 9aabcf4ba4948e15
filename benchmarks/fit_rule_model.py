"""Fit the rule user's appraisal model to SAGE's released logs, and measure how it agrees
with the LLM simulators on turns it was not fitted to.

    python benchmarks/fit_rule_model.py                      # table + rebuild the artefact
    python benchmarks/fit_rule_model.py --no-write           # table only
    python benchmarks/fit_rule_model.py --logs DIR --out FILE

Data: SAGE's dialogue logs (Tencent/digitalhuman, ``SAGE/``, MIT; ``../shared/data/sage/logs``
beside the repository): ``<simulator>_based_simulator/<model>_result.jsonl``. Every
scored agent reply (:attr:`empathy_gym.evaluation.sage_logs.LoggedTurn.scored`) is one row: the
rule user's named features (:meth:`empathy_gym.user.rule_user.RuleUser.features`, the
logged history and emotion) and the sign of the logged change (rows with change 0 are
left out of the fit; they are 0.1% of the GPT-4o logs and 6% of the Gemini log).

Model: L2-regularised logistic regression of the sign (Cox 1958), fitted by L-BFGS-B
(``scipy.optimize.minimize``) with the sign constraints of
:data:`empathy_gym.user.rule_model.SIGN_CONSTRAINTS` as bounds; then ``scale``, the
least-squares fit of the logged change on the fitted logit and its sign, turns logits
into emotion points (``scale * logit + step * sign(logit)``). Mismatched replies (each
logged turn's context with another profile's reply, :func:`mismatched`) join the
logistic fit as negatives of weight ``--negative-weight``, and the intercept is then
refitted on the logged rows. The fit is deterministic; the persona folds and the
mismatched replies are drawn with ``numpy.random.default_rng(--seed)``.

Held-out evaluation (never on turns a model was fitted to), each through the full rule
user (guards included) with :func:`empathy_gym.evaluation.replay.reappraise` and
:func:`empathy_gym.evaluation.replay.agreement`:

* by tested model: leave one model out within the GPT-4o family (fit on 5, predict the 6th);
* by simulator family: fit on GPT-4o, predict the Gemini log (also without GPT-4o's
  o1 log, so that neither the family nor the tested model was seen), and the reverse;
* by persona: 5 folds of SAGE's 100 profiles, fit on the others' turns (both families).

The table goes to ``benchmarks/results/rule_user_agreement.txt``; the artefact, fitted
on every scored turn of every log, to ``empathy_gym/user/rules/appraisal_model.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import optimize, special

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "empathy_gym" / "strategy_templates"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _inputs import inputs_line  # noqa: E402
from _machine import cpu_model, provenance  # noqa: E402  (benchmarks/_machine.py)

from empathy_gym.evaluation.replay import agreement, reappraise, turn_request  # noqa: E402
from empathy_gym.evaluation.sage_logs import log_names, read_sage_log  # noqa: E402
from empathy_gym.user.base import UserRequest  # noqa: E402
from empathy_gym.user.rule_lexicon import load_rules  # noqa: E402
from empathy_gym.user.rule_model import MODEL_PATH, AppraisalModel, group_of, sign_bounds  # noqa: E402
from empathy_gym.user.rule_user import RuleUser  # noqa: E402

DEFAULT_LOGS = ROOT.parent / "shared" / "data" / "sage" / "logs"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "rule_user_agreement.txt"
GPT, GEMINI = "gpt-4o-2024-0806", "gemini-2.5-flash-nothink"
#: The goal of issue 10, on a simulator family the model was not fitted to.
GOAL = {"sign": 0.75, "kappa": 0.5, "spearman": 0.65, "tau": 0.85}


@dataclass
class Rows:
    """Every scored logged turn: requests, features, labels and where each came from."""

    requests: list[UserRequest]
    features: list[dict[str, float]]
    change: np.ndarray  # (n,) int, the logged applied change
    simulator: np.ndarray  # (n,) str
    model: np.ndarray  # (n,) str, the tested model (log file)
    persona: np.ndarray  # (n,) str, the profile id
    files: dict[tuple[str, str], str]


def features_of(requests: Sequence[UserRequest]) -> list[dict[str, float]]:
    """The rule user's named features of each request (no model needed)."""
    extractor = RuleUser(model=AppraisalModel(weights={}, bias=0.0, scale=1.0))
    return [extractor.features(request)[0] for request in requests]


def read_rows(logs: Path) -> Rows:
    """Read every ``*_result.jsonl`` under ``logs`` (sorted) into :class:`Rows`."""
    requests, change, simulator, model, persona, files = [], [], [], [], [], {}
    paths = sorted(logs.glob("*_based_simulator/*_result.jsonl"))
    if not paths:
        raise SystemExit(f"no SAGE logs under {logs} (expected <simulator>_based_simulator/<model>_result.jsonl)")
    for path in paths:
        sim, name = log_names(path)
        files[(sim, name)] = str(path.relative_to(logs))
        for dialogue in read_sage_log(path):
            for turn in dialogue.turns:
                if not turn.scored:
                    continue
                request = turn_request(turn, dialogue.persona)
                requests.append(request)
                change.append(turn.change)
                simulator.append(sim)
                model.append(name)
                persona.append(dialogue.id)
    return Rows(
        requests,
        features_of(requests),
        np.array(change),
        np.array(simulator),
        np.array(model),
        np.array(persona),
        files,
    )


def mismatched(rows: Rows, mask: np.ndarray, seed: int) -> list[UserRequest]:
    """Each masked row's request (history, emotion, turn) with its reply swapped for the
    reply of a random masked turn of another profile's dialogue
    (``numpy.random.default_rng(seed)``; only masked turns, so no held-out reply leaks
    into a fit).

    SAGE's tested models always answer the person in front of them, so the logs hold
    almost no reply that ignores the user's story, and a model fitted on them alone
    learns that the first turns go up whatever is said (a word salad from a small policy
    included). Another dialogue's reply, in this dialogue's context, is the plainest bad
    reply there is: these rows join the fit as negatives (``--negative-weight``) and
    teach grounding and echo; the table reports how the fitted user appraises them.
    """
    rng = np.random.default_rng(seed)
    chosen = np.flatnonzero(mask)
    swapped = []
    for i in chosen:
        while True:
            j = int(chosen[rng.integers(len(chosen))])
            if rows.persona[j] != rows.persona[i]:
                break
        swapped.append(dataclasses.replace(rows.requests[i], utterance=rows.requests[j].utterance))
    return swapped


def fit(
    features: Sequence[dict[str, float]],
    change: np.ndarray,
    C: float,
    keep: Callable[[str], bool] = lambda name: True,
    negatives: Sequence[dict[str, float]] = (),
    negative_weight: float = 0.0,
    bounded: bool = True,
) -> AppraisalModel:
    """The logistic fit described in the module docstring, on the rows given.

    Args:
        features: one dict per row. change: (n,) logged changes (0 rows are dropped).
        C: inverse L2 strength (scikit-learn's convention: loss sum + ||w||^2 / (2 C)).
        keep: which feature names the model may use (ablations).
        negatives: feature dicts of mismatched replies (:func:`mismatched`), each a
            negative row of weight ``negative_weight`` in the logistic loss; they take
            no part in the fit of ``scale`` and ``step`` (they have no logged change).
        bounded: respect :data:`~empathy_gym.user.rule_model.SIGN_CONSTRAINTS` (False:
            only to measure what the bounds cost, ``benchmarks/agreement_ceiling.py``).
    """
    if negative_weight <= 0:
        negatives = ()
    names = sorted({name for row in (*features, *negatives) for name in row if keep(name)})
    index = {name: i for i, name in enumerate(names)}
    rows = [i for i, value in enumerate(change) if value != 0]
    X = np.zeros((len(rows) + len(negatives), len(names)))
    for r, row_features in enumerate([features[i] for i in rows] + list(negatives)):
        for name, value in row_features.items():
            if name in index:
                X[r, index[name]] = value
    t = np.concatenate([np.where(change[rows] > 0, 1.0, -1.0), -np.ones(len(negatives))])
    sample = np.concatenate([np.ones(len(rows)), np.full(len(negatives), negative_weight)])

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:-1], theta[-1]
        z = X @ w + b
        margin = t * z
        value = np.sum(sample * np.logaddexp(0.0, -margin)) + w @ w / (2 * C)
        dz = -t * sample * special.expit(-margin)
        return value, np.append(X.T @ dz + w / C, dz.sum())

    bounds = (sign_bounds(names) if bounded else [(None, None)] * len(names)) + [(None, None)]
    result = optimize.minimize(
        loss, np.zeros(len(names) + 1), jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": 5000}
    )
    w, b = result.x[:-1], float(result.x[-1])
    if len(negatives):
        # The negatives pull the intercept down for every reply; refit it on the logged
        # rows alone (weights fixed), so the logs' base rate of + stays calibrated.
        z, real = X[: len(rows)] @ w, t[: len(rows)]
        b = float(optimize.minimize_scalar(lambda c: np.sum(np.logaddexp(0.0, -real * (z + c)))).x)
    logit = X[: len(rows)] @ w + b
    design = np.column_stack([logit, np.sign(logit)])
    (scale, step), *_ = np.linalg.lstsq(design, change[rows].astype(float), rcond=None)
    weights = {name: float(value) for name, value in zip(names, w) if abs(value) > 1e-6}
    return AppraisalModel(
        weights=weights,
        bias=b,
        scale=float(scale),
        step=max(float(step), 0.0),
        meta={
            "fit": {
                "rows": len(rows),
                "negatives": len(negatives),
                "negative_weight": negative_weight,
                "C": C,
                "converged": bool(result.success),
            }
        },
    )


def evaluate(rows: Rows, model: AppraisalModel, mask: np.ndarray) -> tuple[list[int], dict]:
    """The full rule user with ``model`` on the masked turns: its changes and agreement."""
    user = RuleUser(model=model)
    requests = [request for request, keep in zip(rows.requests, mask) if keep]
    predicted = reappraise(user, requests)
    return predicted, agreement(predicted, rows.change[mask], rows.model[mask].tolist()).as_dict()


def row(name: str, result: dict) -> str:
    tau = result.get("kendall_tau")
    return (
        f"{name:58s} {result['turns']:6d} {result['sign_agreement']:6.3f} {result['chance_agreement']:6.3f} "
        f"{result['cohen_kappa']:6.3f} {result['spearman']:6.3f} {result['mae']:5.2f} "
        f"{'   -' if tau is None else f'{tau:+5.2f}'}"
    )


def is_mood(name: str) -> bool:
    return group_of(name) == "mood"


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def fit_arguments(out: Path) -> argparse.ArgumentParser:
    """The options every script that fits the rule user to the logs takes (an argparse
    parent parser): ``--logs``, ``--out`` (default ``out``), ``--C``, ``--negative-weight``
    (>= 0) and ``--no-write``."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--logs", type=Path, default=DEFAULT_LOGS, help="folder of SAGE logs")
    parser.add_argument("--out", type=Path, default=out, help="where the table goes")
    parser.add_argument("--C", type=float, default=0.3, help="inverse L2 strength of the fit")
    parser.add_argument(
        "--negative-weight",
        type=_non_negative,
        default=0.5,
        help="weight of each mismatched-reply negative in the fit (0: none; see mismatched)",
    )
    parser.add_argument("--no-write", action="store_true", help="print the table, write nothing")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        parents=[fit_arguments(DEFAULT_OUT)],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model-out", type=Path, default=MODEL_PATH, help="where the artefact goes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the persona folds and the mismatched replies")
    args = parser.parse_args(argv)

    started = time.time()
    rows = read_rows(args.logs)
    gpt, gem = rows.simulator == GPT, rows.simulator == GEMINI
    lines: list[str] = []
    report = {}
    out = lines.append
    header = (
        f"{'split: fitted on -> evaluated on':58s} {'turns':>6s} {'sign':>6s} {'chance':>6s} "
        f"{'kappa':>6s} {'spear':>6s} {'MAE':>5s} {'tau':>5s}"
    )

    swapped_changes: dict[str, list[int]] = {}

    def lomo(keep=lambda name: True, label: str = "", negative_weight: float | None = None) -> tuple[np.ndarray, dict]:
        predicted = np.zeros(len(rows.change), dtype=int)
        for name in sorted(set(rows.model[gpt])):
            held = gpt & (rows.model == name)
            model = fitted(gpt & ~held, keep, negative_weight)
            predicted[held] = evaluate(rows, model, held)[0]
            swapped_changes.setdefault(label, []).extend(
                reappraise(RuleUser(model=model), mismatched(rows, held, args.seed + 1))
            )
        return predicted, agreement(predicted[gpt], rows.change[gpt], rows.model[gpt].tolist()).as_dict()

    def fitted(mask: np.ndarray, keep=lambda name: True, negative_weight: float | None = None) -> AppraisalModel:
        weight = args.negative_weight if negative_weight is None else negative_weight
        negatives = features_of(mismatched(rows, mask, args.seed)) if weight > 0 else ()
        return fit([f for f, m in zip(rows.features, mask) if m], rows.change[mask], args.C, keep, negatives, weight)

    splits: dict[str, dict] = {}
    per_file: dict[tuple[str, str], dict] = {}
    for label, keep in (
        ("", lambda name: True),
        (" [text only]", lambda name: not is_mood(name)),
        (" [state only]", is_mood),
    ):
        predicted, result = lomo(keep, label)
        splits[f"GPT-4o, 5 models -> the 6th (leave one model out){label}"] = result
        if not label:
            first = gpt & (np.array([request.turn for request in rows.requests]) == 1)
            splits["the same, first replies only (turn 1)"] = agreement(
                predicted[first], rows.change[first], rows.model[first].tolist()
            ).as_dict()
            for name in sorted(set(rows.model[gpt])):
                mask = gpt & (rows.model == name)
                per_file[(GPT, name)] = agreement(predicted[mask], rows.change[mask]).as_dict()
        _, result = evaluate(rows, fitted(gpt & (rows.model != "openai-o1"), keep), gem)
        splits[f"GPT-4o without o1 -> Gemini (o1){label}"] = result
        _, result = evaluate(rows, fitted(gpt, keep), gem)
        splits[f"GPT-4o, all 6 -> Gemini (o1){label}"] = result
        if not label:
            per_file[(GEMINI, "openai-o1")] = result
        _, result = evaluate(rows, fitted(gem, keep), gpt)
        splits[f"Gemini (o1) -> GPT-4o, 6 models{label}"] = result
    if args.negative_weight > 0:
        label = " [no mismatched negatives]"
        splits[f"GPT-4o, 5 models -> the 6th{label}"] = lomo(label=label, negative_weight=0.0)[1]
    # By persona: 5 folds of the profiles, both families.
    ids = np.array(sorted(set(rows.persona)))
    folds = np.array_split(np.random.default_rng(args.seed).permutation(ids), 5)
    predicted = np.zeros(len(rows.change), dtype=int)
    for fold in folds:
        held = np.isin(rows.persona, fold)
        predicted[held] = evaluate(rows, fitted(~held), held)[0]
    for family, mask in (("GPT-4o", gpt), ("Gemini", gem)):
        splits[f"other 80 profiles -> 20 held-out profiles, {family} (5 folds)"] = agreement(
            predicted[mask], rows.change[mask], rows.model[mask].tolist()
        ).as_dict()
    always = agreement([5] * int(gpt.sum()), rows.change[gpt], rows.model[gpt].tolist()).as_dict()

    final = fitted(np.ones(len(rows.change), dtype=bool))
    # Speed: full appraisals (features + model + guards) per second, one process, on texts
    # never scanned before (fresh lexicon caches); the personas' stories are built first
    # (once per persona) on another log file's turns. Best and median of 5 tries: on shared
    # cores one try swings 2-3x.
    first, second = sorted(set(rows.model[gpt]))[:2]
    sample = [r for r, m, k in zip(rows.requests, rows.model, gpt) if k and m == second]
    speeds = []
    for _ in range(5):
        load_rules.cache_clear()
        user = RuleUser(model=final)
        user.appraise([r for r, m, k in zip(rows.requests, rows.model, gpt) if k and m == first])
        tick = time.perf_counter()
        user.appraise(sample)
        speeds.append(len(sample) / (time.perf_counter() - tick))

    out("# The rule user's appraisal against SAGE's LLM simulators, held out (benchmarks/fit_rule_model.py)")
    out(provenance())  # its inputs line follows once the artefact is written (the rule user it fits)
    out(
        f"# machine: {cpu_model()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
        "(other developers share these cores)"
    )
    out(
        f"# logs: {args.logs.name}/ ({len(rows.change)} scored turns: GPT-4o {int(gpt.sum())}, Gemini {int(gem.sum())})"
    )
    out("# Every row re-appraises logged turns with the logged history and emotion (empathy_gym.evaluation.replay),")
    out("# through the full rule user (fitted model + guards), with a model fitted on other turns only.")
    out("# sign: share of turns with the same sign (-, 0, +); chance: expected from the marginals;")
    out("# kappa: Cohen's; spear: Spearman; MAE: emotion points; tau: Kendall tau of the tested models'")
    out("# mean change (6 models in the GPT-4o family; the Gemini log has one model).")
    out(
        f"# Goal (issue 10), on a family not fitted to: sign >= {GOAL['sign']}, kappa >= {GOAL['kappa']}, "
        f"Spearman >= {GOAL['spearman']}, tau >= {GOAL['tau']}."
    )
    out("")
    out(header)
    out("before: rule user at 986ede6 (lexicon weights set by hand)      5147  0.506  0.460  0.085  0.168     - -0.20")
    out("before: the same on the Gemini log                               797  0.460  0.450  0.019  0.084     -    -")
    out(row("always +5 on the GPT-4o logs (for scale)", always).replace(" +nan", "    -").replace("   nan", "     -"))
    out("")
    out("held out by tested model and by simulator family (features: reply + user's state)")
    headings = {
        "[text only]": [
            "ablation: text only = without the user's state (emotion, turn, momentum, intention and",
            "character one-hots); state only = nothing but those",
        ],
        "[no mismatched": ["the same without the mismatched-reply negatives in the fit"],
        "other 80": ["by persona (fitted on both families)"],
    }
    for name, result in splits.items():
        for key in list(headings):
            if key in name:
                out("")
                for line in headings.pop(key):
                    out(line)
        out(row(name, result))
    out("")
    out("per log file (held-out predictions: leave one model out for GPT-4o; GPT-4o -> Gemini for Gemini)")
    out(
        f"{'simulator / tested model':58s} {'turns':>6s} {'sign':>6s} {'chance':>6s} {'kappa':>6s} "
        f"{'spear':>6s} {'MAE':>5s}  mean logged / predicted"
    )
    for (sim, name), result in sorted(per_file.items()):
        mask = (rows.simulator == sim) & (rows.model == name)
        model_means = (
            splits["GPT-4o, 5 models -> the 6th (leave one model out)"]["per_model"].get(name) if sim == GPT else None
        )
        predicted_mean = model_means["mean_predicted"] if model_means else float("nan")
        if sim == GEMINI:
            predicted_mean = splits["GPT-4o, all 6 -> Gemini (o1)"]["per_model"][name]["mean_predicted"]
        out(
            f"{rows.files[(sim, name)]:58s} {result['turns']:6d} {result['sign_agreement']:6.3f} "
            f"{result['chance_agreement']:6.3f} {result['cohen_kappa']:6.3f} {result['spearman']:6.3f} "
            f"{result['mae']:5.2f}  {rows.change[mask].mean():+5.2f} / {predicted_mean:+5.2f}"
        )
    out("")
    out("a reply meant for someone else: each held-out GPT-4o turn (leave one model out) with its reply swapped")
    out("for a random reply of the same log file to another profile; an LLM simulator would not be pleased")
    out(
        f"{'model':58s} {'turns':>6s} {'share < 0':>9s} {'share > 0':>9s}  mean change (logged replies: "
        f"{rows.change[gpt].mean():+.2f})"
    )
    for label, changes in swapped_changes.items():
        changes_array = np.array(changes)
        out(
            f"{'fitted user' + label:58s} {len(changes):6d} {np.mean(changes_array < 0):9.3f} "
            f"{np.mean(changes_array > 0):9.3f}  {changes_array.mean():+.2f}"
        )
    out("")
    out(
        f"speed: {max(speeds):,.0f} appraisals/s, best of 5 (median {np.median(speeds):,.0f}; features + model + "
        f"guards, one process, {len(sample)} logged turns never seen before; SAGE's replies run to 150-440 characters)"
    )
    out(
        f"artefact: fitted on all {final.meta['fit']['rows']} non-zero turns and {final.meta['fit']['negatives']} "
        f"mismatched replies (weight {args.negative_weight:g}), {len(final.weights)} non-zero weights, scale "
        f"{final.scale:.3f} points per logit; took {time.time() - started:.0f} s in all"
    )
    text = "\n".join(lines) + "\n"
    print(text)
    report = {
        name: {key: value for key, value in result.items() if key != "confusion"} for name, result in splits.items()
    }
    if args.no_write:
        return
    units = en_units_per_word()
    meta = {
        "name": "empathy-gym rule user appraisal model",
        "licence": "MIT (fitted to SAGE's released logs, Copyright (c) Tencent, MIT; see "
        "tests/data/sage_logs/LICENSE.txt). The weights themselves: the project's licence.",
        "provenance": {
            "data": "SAGE (arXiv 2505.02847) released dialogue logs, Tencent/digitalhuman SAGE/, "
            "every scored agent turn of: " + ", ".join(sorted(rows.files.values())),
            "script": "benchmarks/fit_rule_model.py",
            "command": f"python benchmarks/fit_rule_model.py --C {args.C} --seed {args.seed} "
            f"--negative-weight {args.negative_weight:g}",
            "date": f"{datetime.date.today():%Y-%m-%d}",
            "python": platform.python_version(),
            "en_units_per_word": "Chinese units (CJK characters + Latin words) per English word in the "
            "parallel en/zh strategy templates and baseline listener templates",
        },
        "held_out": {
            name: {
                key: report[name][key] for key in ("turns", "sign_agreement", "cohen_kappa", "spearman", "kendall_tau")
            }
            for name in report
        },
        "fit": final.meta["fit"],
    }
    AppraisalModel(
        weights=final.weights, bias=final.bias, scale=final.scale, step=final.step, en_units_per_word=units, meta=meta
    ).save(args.model_out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join([*lines[:2], inputs_line(["rule-user"]), *lines[2:]]) + "\n", encoding="utf-8")
    print(f"wrote {args.out} and {args.model_out}")


def en_units_per_word() -> float:
    """Chinese length units per English word, measured on the package's parallel texts
    (strategy templates and the listener baseline's templates, en and zh)."""
    from empathy_gym.evaluation.baselines import ListenerAgent

    def units(text: str) -> int:
        return len(re.findall(r"[\u4e00-\u9fff]", text)) + len(re.findall(r"[A-Za-z0-9']+", text))

    pairs = list(zip(ListenerAgent.EN, ListenerAgent.ZH))
    templates = {
        code: json.loads((ROOT / "empathy_gym" / "strategy_templates" / f"{code}.json").read_text(encoding="utf-8"))[
            "strategies"
        ]
        for code in ("en", "zh")
    }
    for key, english in templates["en"].items():
        pairs += [(e, z) for e, z in zip(english, templates["zh"][key]) if isinstance(e, str) and isinstance(z, str)]
    strip = re.compile(r"\{[a-z]+\}")
    english_words = sum(len(re.findall(r"[A-Za-z0-9']+", strip.sub("", e))) for e, _ in pairs)
    chinese_units = sum(units(strip.sub("", z)) for _, z in pairs)
    return round(chinese_units / english_words, 3)


if __name__ == "__main__":
    main()
