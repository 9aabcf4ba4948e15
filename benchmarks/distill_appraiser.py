"""Distil the shipped appraiser from SAGE's logs, and measure how it agrees with SAGE's LLM
simulators on what it was not fitted to, beside the rule user and the best lexical learner.

    python benchmarks/distill_appraiser.py [--logs DIR] [--work runs/distill-sage] [--base-model smollm2] [--no-write]

1. ``empathy_gym.user.distill.distill`` on every log (resumable: about 100 minutes on two
   cores for the base model's features; the head takes seconds); the appraiser it saves
   (its head fitted on every logged turn) is copied to ``empathy_gym/user/distilled/``,
   the shipped one, unless ``--no-write``.
2. Held out by simulator family (fitted on one family's turns, scored on every turn of
   the other, both ways) and by tested model within GPT-4o (fitted on five models, scored
   on the sixth; Kendall's tau over the six models' mean changes), each judge fitted on
   the same turns:

   * the distilled appraiser (head on the base model's states and the named features),
     and its head on the named features alone (no language model: what the states add);
   * the rule user refitted on those turns (``benchmarks/fit_rule_model.py``'s fit, with
     its guards), under the moderate and the challenging difficulty;
   * the best lexical learner of ``agreement_ceiling.txt`` (scikit-learn).

   The distilled appraiser's change is the mean of its distribution; the lexical learner's
   score is its decision value (sign, Spearman and tau need no scale).
3. Bad replies (:mod:`empathy_gym.user.probes`) scored below the reply of their context,
   on the held-out family's contexts, by kind.

Writes ``benchmarks/results/distilled_agreement.txt`` (unless ``--no-write``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _machine import cpu_model  # noqa: E402
from fit_rule_model import DEFAULT_LOGS, GEMINI, GPT, features_of, fit, mismatched, read_rows  # noqa: E402

from empathy_gym.evaluation.replay import agreement, reappraise  # noqa: E402
from empathy_gym.user.appraiser import SHIPPED, expected_change  # noqa: E402
from empathy_gym.user.distill import HeadOptions, bad_below, distill, fit_head, lexical_learner, predict  # noqa: E402
from empathy_gym.user.distill_rows import FLUENT, Rows, load_rows, subset  # noqa: E402
from empathy_gym.user.rule_user import RuleUser  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "distilled_agreement.txt"
HEADER = f"{'judge':58s} {'turns':>5s} {'sign':>6s} {'chance':>6s} {'kappa':>6s} {'spear':>6s} {'tau':>6s}"


def row(name: str, values: np.ndarray, logged: np.ndarray, models: list[str]) -> str:
    result = agreement(values, logged, models).as_dict()
    tau = result["kendall_tau"]
    return (
        f"{name:58s} {result['turns']:5d} {result['sign_agreement']:6.3f} {result['chance_agreement']:6.3f} "
        f"{result['cohen_kappa']:6.3f} {result['spearman']:6.3f} {'     -' if tau is None else f'{tau:+6.2f}'}"
    )


class RuleFits:
    """The rule user refitted on a set of logged turns (fit_rule_model.py's recipe), keyed
    like the distilled rows: ``(log name, profile id, turn)``."""

    def __init__(self, logs: Path):
        self.rows = read_rows(logs)
        self.index = {
            (f"{sim}/{model}", str(persona), request.turn): i
            for i, (sim, model, persona, request) in enumerate(
                zip(self.rows.simulator, self.rows.model, self.rows.persona, self.rows.requests)
            )
        }

    def changes(self, train: np.ndarray, keys: list[tuple[str, str, int]], difficulty: str) -> np.ndarray:
        """The refitted rule user's change for each key, fitted on the ``train`` turns (a mask of ``self.rows``)."""
        negatives = features_of(mismatched(self.rows, train, 0))
        features = [f for f, keep in zip(self.rows.features, train) if keep]
        model = fit(features, self.rows.change[train], 0.3, negatives=negatives, negative_weight=0.5)
        requests = [self.rows.requests[self.index[key]] for key in keys]
        return np.asarray(reappraise(RuleUser(model=model, difficulty=difficulty), requests), dtype=float)

    def mask(
        self, simulator: str | None = None, model: str | None = None, exclude_model: str | None = None
    ) -> np.ndarray:
        keep = np.ones(len(self.rows.change), dtype=bool)
        if simulator is not None:
            keep &= self.rows.simulator == simulator
        if model is not None:
            keep &= self.rows.model == model
        if exclude_model is not None:
            keep &= self.rows.model != exclude_model
        return keep


def keys_of(rows: Rows) -> list[tuple[str, str, int]]:
    return [
        (str(log), str(dialogue).split("#", 1)[1], int(turn))
        for log, dialogue, turn in zip(rows.log, rows.dialogue, rows.turn)
    ]


def judges(
    rows: Rows, train: np.ndarray, test: np.ndarray, rules: RuleFits, rule_train: np.ndarray
) -> tuple[dict[str, np.ndarray], Rows]:
    """Every judge's score on the rows of ``test`` (the rule users' on its logged rows
    only, NaN elsewhere), each fitted on ``train``; and those rows."""
    train_rows, test_rows = subset(rows, train), subset(rows, test)
    logged = ~np.isnan(test_rows.change)
    scores = {}
    for name, options in (
        ("distilled appraiser", HeadOptions()),
        ("distilled head on the named features alone (no LM)", HeadOptions(use_states=False)),
    ):
        mean = expected_change(predict(fit_head(train_rows, options), test_rows))
        scores[name] = mean
    keys = keys_of(subset(test_rows, logged))
    for difficulty in ("moderate", "challenging"):
        values = np.full(len(test_rows.kind), np.nan)
        values[logged] = rules.changes(rule_train, keys, difficulty)
        scores[f"rule user refitted on the same turns, {difficulty}"] = values
    lexical = lexical_learner(train_rows, test_rows)
    if lexical is not None:
        scores["lexical learner: named + char n-grams, reply + last message"] = lexical
    return scores, test_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--logs", type=Path, default=DEFAULT_LOGS)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "distill-sage")
    parser.add_argument("--base-model", default="smollm2")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    started = time.time()
    result = distill([args.logs], args.work, base_model=args.base_model)
    if not args.no_write:
        SHIPPED.mkdir(parents=True, exist_ok=True)
        for name in ("appraiser.json", "head.safetensors", "report.txt", "MODEL_CARD.md"):
            shutil.copyfile(args.work / name, SHIPPED / name)
    rows = Rows.concatenate([load_rows(path) for path in sorted((args.work / "features").glob("*.npz"))])
    rules = RuleFits(args.logs)
    lines = [
        "# The distilled appraiser against SAGE's simulators, held out (benchmarks/distill_appraiser.py)",
        f"# run: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%MZ}, command: python "
        f"benchmarks/distill_appraiser.py {' '.join(sys.argv[1:])}".rstrip(),
        f"# machine: {cpu_model()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"# rows: {result.report['rows']}; features in {args.work}/features (the base model's pass; "
        f"{result.resumed} shards found done)",
        "# Goal (issue 36), on a family not fitted to: sign >= 0.75, kappa >= 0.45, Spearman >= 0.60, tau >= 0.85.",
        "",
    ]
    english = rows.kind == FLUENT
    bad_lines = []
    for fitted_on, scored_on, label in ((GPT, GEMINI, "GPT-4o -> Gemini"), (GEMINI, GPT, "Gemini -> GPT-4o")):
        train = (rows.simulator == fitted_on) | english
        scores, test_rows = judges(rows, train, rows.simulator == scored_on, rules, rules.mask(simulator=fitted_on))
        logged = ~np.isnan(test_rows.change)
        models = test_rows.model[logged].tolist()
        lines += [f"fitted on one family, scored on every turn of the other: {label}", HEADER]
        lines += [row(name, values[logged], test_rows.change[logged], models) for name, values in scores.items()]
        lines.append("")
        for name in ("distilled appraiser", "rule user refitted on the same turns, moderate"):
            values = scores[name] if name == "distilled appraiser" else test_rows.rule_change
            shares = bad_below(test_rows, values)
            kinds = ", ".join(f"{kind} {share:.2f}" for kind, share in shares.items())
            bad_lines.append(
                f"{label}, {'distilled appraiser' if name == 'distilled appraiser' else 'shipped rule user'}: {kinds}"
            )
    gpt_models = sorted(set(rows.model[rows.simulator == GPT]))
    lomo: dict[str, np.ndarray] = {}
    logged_all, model_all = [], []
    for held in gpt_models:
        test = (rows.simulator == GPT) & (rows.model == held)
        train = ((rows.simulator == GPT) & (rows.model != held)) | english
        scores, test_rows = judges(rows, train, test, rules, rules.mask(simulator=GPT, exclude_model=held))
        logged = ~np.isnan(test_rows.change)
        for name, values in scores.items():
            lomo.setdefault(name, []).append(values[logged])
        logged_all.append(test_rows.change[logged])
        model_all += test_rows.model[logged].tolist()
    lines += [
        "held out by tested model within GPT-4o (fitted on five models, scored on the sixth; tau over six)",
        HEADER,
    ]
    logged_all = np.concatenate(logged_all)
    lines += [row(name, np.concatenate(parts), logged_all, model_all) for name, parts in lomo.items()]
    lines += [
        "",
        "bad replies scored below their context's reply (the held-out family's contexts), by kind:",
        *bad_lines,
    ]
    lines += ["", "the shipped appraiser's own report (held out: " + ", ".join(result.report["heldout_models"]) + "):"]
    lines += result.text.rstrip().splitlines()
    lines.append(f"took {time.time() - started:.0f} s")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        OUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUT} and {SHIPPED}")


if __name__ == "__main__":
    main()
