"""How far per-turn agreement with an unseen simulator family goes: the two LLM
simulator families against each other, and other learners on the rule user's splits.

    python benchmarks/agreement_ceiling.py [--logs DIR] [--out FILE] [--C C]

Needs scikit-learn (``pip install -e ".[bench]"``). Data: SAGE's released logs, as in
``benchmarks/fit_rule_model.py`` (whose :func:`read_rows` and :func:`fit` it uses).

Part 1, the simulators against each other. The first scored reply of every dialogue
answers the profile's fixed opening line, so first replies to the same profile share
their whole context: the only differences are the reply (another tested model, or
another sample of the same one) and the judge. Rows compare the logged changes of such
pairs (same judge and different replies; different judges), and the rule user's
held-out changes on the very same first replies. No reply in the logs was judged by
both families, so the simulator rows mix the judges' disagreement with the replies'
differences; the same-judge row gives the size of the latter. Then the rule user's and
the best learner's agreement by the reply's turn (GPT-4o, leave one model out), and the
numbers of a change that was tried and withdrawn (printed as text, with its commit).

Part 2, other learners on the cross-family splits of ``fit_rule_model.py`` (fit on all
of one family, predict every turn of the other), side by side with the rule user:
L2 logistic regression of the sign (``sklearn.linear_model.LogisticRegression``) or
ridge regression of the change (``sklearn.linear_model.Ridge``) on character 1-3-grams
of the reply (``CountVectorizer(analyzer="char", binary=True, min_df=3)``, rows
L2-normalised), on the rule user's named features, on both, and with character
1-2-grams of the user's last message. A learner's sign is the sign of its decision
value; Spearman and Kendall's tau use the decision value itself; MAE is left out (its
scale is not emotion points). The rule user rows go through the full rule user
(guards included), as in the agreement table.

The table goes to ``benchmarks/results/agreement_ceiling.txt``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _machine import cpu_model, provenance  # noqa: E402
from fit_rule_model import GEMINI, GOAL, GPT, Rows, evaluate, features_of, fit, fit_arguments, mismatched, read_rows  # noqa: E402

from empathy_gym.evaluation.replay import agreement  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "agreement_ceiling.txt"
O1 = "openai-o1"


def first_replies(rows: Rows) -> dict[str, dict[tuple[str, str], int]]:
    """Row index of each dialogue's first scored reply: ``{profile: {(simulator, model): i}}``.

    Only first replies whose context (history) equals that of the profile's other first
    replies are kept; a profile whose logged opening lines differ keeps the most common one.
    """
    by_profile: dict[str, dict[tuple[str, str], int]] = {}
    for i, request in enumerate(rows.requests):
        if request.turn == 1:
            by_profile.setdefault(str(rows.persona[i]), {})[(str(rows.simulator[i]), str(rows.model[i]))] = i
    for profile, found in by_profile.items():
        histories = [rows.requests[i].history for i in found.values()]
        common = max(histories, key=histories.count)
        by_profile[profile] = {key: i for key, i in found.items() if rows.requests[i].history == common}
    return by_profile


def judge_pairs(rows: Rows) -> dict[str, tuple[list[int], list[int]]]:
    """Pairs of first replies to the same profile (row indices ``(left, right)``):

    * ``same_judge``: GPT-4o's changes for two different tested models (every pair);
    * ``o1_two_judges``: o1's reply judged by GPT-4o, and o1's other sample by Gemini;
    * ``any_two_judges``: each GPT-4o-judged model's reply, and o1's sample judged by Gemini.
    """
    pairs: dict[str, tuple[list[int], list[int]]] = {
        "same_judge": ([], []),
        "o1_two_judges": ([], []),
        "any_two_judges": ([], []),
    }

    def add(name: str, left: int, right: int) -> None:
        pairs[name][0].append(left)
        pairs[name][1].append(right)

    for found in first_replies(rows).values():
        gpt = sorted((model, i) for (sim, model), i in found.items() if sim == GPT)
        for (_, left), (_, right) in itertools.combinations(gpt, 2):
            add("same_judge", left, right)
        gemini_o1 = found.get((GEMINI, O1))
        if gemini_o1 is None:
            continue
        for model, i in gpt:
            add("any_two_judges", i, gemini_o1)
            if model == O1:
                add("o1_two_judges", i, gemini_o1)
    return pairs


def ngram_learner(
    rows: Rows,
    train: np.ndarray,
    test: np.ndarray,
    *,
    learner: str,
    reply: bool,
    named: bool,
    last_user: bool,
    C: float,
) -> np.ndarray:
    """Decision values (``(test.sum(),)`` float) of one scikit-learn learner fitted on
    the ``train`` rows (module docstring, part 2). ``learner``: ``"logistic"`` (sign,
    rows with change 0 left out) or ``"ridge"`` (change; ``alpha = 1 / C``)."""
    from scipy import sparse
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.preprocessing import normalize

    def texts(mask: np.ndarray, pick) -> list[str]:
        return [pick(request) for request, keep in zip(rows.requests, mask) if keep]

    def last_user_message(request) -> str:
        return next((text for role, text in reversed(request.history) if role == "user"), "")

    blocks_train, blocks_test = [], []
    for wanted, pick, ngrams in (
        (reply, lambda request: request.utterance, (1, 3)),
        (last_user, last_user_message, (1, 2)),
    ):
        if wanted:
            vectoriser = CountVectorizer(analyzer="char", ngram_range=ngrams, binary=True, min_df=3)
            blocks_train.append(normalize(vectoriser.fit_transform(texts(train, pick)).astype(float)))
            blocks_test.append(normalize(vectoriser.transform(texts(test, pick)).astype(float)))
    if named:
        vectoriser = DictVectorizer()
        blocks_train.append(vectoriser.fit_transform([f for f, keep in zip(rows.features, train) if keep]))
        blocks_test.append(vectoriser.transform([f for f, keep in zip(rows.features, test) if keep]))
    x_train, x_test = sparse.hstack(blocks_train).tocsr(), sparse.hstack(blocks_test).tocsr()
    change = rows.change[train].astype(float)
    if learner == "ridge":
        return Ridge(alpha=1.0 / C).fit(x_train, change).predict(x_test)
    nonzero = change != 0
    model = LogisticRegression(C=C, max_iter=5000).fit(x_train[nonzero], np.sign(change[nonzero]))
    return model.decision_function(x_test)


def row(name: str, result: dict, mae: bool = True) -> str:
    tau = result.get("kendall_tau")
    mae_text = f"{result['mae']:5.2f}" if mae else "    -"
    tau_text = "    -" if tau is None else f"{tau:+5.2f}"
    return (
        f"{name:66s} {result['turns']:5d} {result['sign_agreement']:6.3f} {result['chance_agreement']:6.3f} "
        f"{result['cohen_kappa']:6.3f} {result['spearman']:6.3f} {mae_text} {tau_text}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        parents=[fit_arguments(DEFAULT_OUT)],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    args = parser.parse_args(argv)
    try:
        import sklearn  # noqa: F401
    except ImportError:
        parser.error('needs scikit-learn: pip install -e ".[bench]"')

    started = time.time()
    rows = read_rows(args.logs)
    gpt, gem = rows.simulator == GPT, rows.simulator == GEMINI
    if not gpt.any() or not gem.any():
        raise SystemExit(f"{args.logs}: needs logs of both simulator families ({GPT}, {GEMINI})")

    def rule_user(train: np.ndarray, test: np.ndarray, bounded: bool = True) -> np.ndarray:
        negatives = features_of(mismatched(rows, train, 0)) if args.negative_weight > 0 else ()
        model = fit(
            [f for f, keep in zip(rows.features, train) if keep],
            rows.change[train],
            args.C,
            negatives=negatives,
            negative_weight=args.negative_weight,
            bounded=bounded,
        )
        predicted = np.zeros(len(rows.change))
        predicted[test] = evaluate(rows, model, test)[0]
        return predicted

    header = f"{'':66s} {'turns':>5s} {'sign':>6s} {'chance':>6s} {'kappa':>6s} {'spear':>6s} {'MAE':>5s} {'tau':>5s}"
    # Part 2 first: part 1 reuses its GPT-4o -> Gemini fits (the rule user, the best learner).
    best_parts = {"reply": True, "named": True, "last_user": True}
    cross: dict[tuple[str, str], np.ndarray] = {}
    part2 = ["part 2: fitted on one family, every turn of the other (scikit-learn learners: no MAE)"]
    for train, test, direction in ((gpt, gem, "GPT-4o -> Gemini"), (gem, gpt, "Gemini -> GPT-4o")):
        part2 += [direction, header]
        models = rows.model[test].tolist()
        for label, bounded in (
            ("rule user (shipped recipe: bounds, negatives, guards)", True),
            ("rule user without the sign bounds", False),
        ):
            predicted = rule_user(train, test, bounded)[test]
            cross[(direction, label)] = predicted
            part2.append(row(label, agreement(predicted, rows.change[test], models).as_dict()))
        for learner in ("logistic", "ridge"):
            for label, parts in (
                ("char n-grams of the reply", {"reply": True, "named": False, "last_user": False}),
                ("rule user's named features", {"reply": False, "named": True, "last_user": False}),
                ("both", {"reply": True, "named": True, "last_user": False}),
                ("both + char n-grams of the user's last message", best_parts),
            ):
                decision = ngram_learner(rows, train, test, learner=learner, C=args.C, **parts)
                cross[(direction, f"{learner}: {label}")] = decision
                part2.append(
                    row(f"{learner}: {label}", agreement(decision, rows.change[test], models).as_dict(), mae=False)
                )
        part2.append("")

    lines: list[str] = []
    out = lines.append
    out("# How far per-turn agreement with an unseen simulator family goes (benchmarks/agreement_ceiling.py)")
    out(provenance(inputs=["rule-user"]))
    out(f"# machine: {cpu_model()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    out(
        f"# logs: {args.logs.name}/ ({len(rows.change)} scored turns: GPT-4o {int(gpt.sum())}, "
        f"Gemini {int(gem.sum())}); columns as in rule_user_agreement.txt"
    )
    out(
        f"# Goal (issue 10), on a family not fitted to: sign >= {GOAL['sign']}, kappa >= {GOAL['kappa']}, "
        f"Spearman >= {GOAL['spearman']}, tau >= {GOAL['tau']}."
    )
    out("")
    out("part 1: first replies to the same profile (same opening line, so the same context)")
    out(header)
    pairs = judge_pairs(rows)
    labels = {
        "same_judge": "GPT-4o vs GPT-4o: two tested models' replies (same judge)",
        "o1_two_judges": "GPT-4o vs Gemini: two samples of o1's reply",
        "any_two_judges": "GPT-4o vs Gemini: any tested model's reply, o1's reply",
    }
    for key, label in labels.items():
        left, right = pairs[key]
        if left:
            out(row(label, agreement(rows.change[left], rows.change[right]).as_dict()))
    first = np.zeros(len(rows.change), dtype=bool)
    first[[i for found in first_replies(rows).values() for i in found.values()]] = True
    held_out, learnt = np.zeros(len(rows.change)), np.zeros(len(rows.change))
    held_out[gem] = cross[("GPT-4o -> Gemini", "rule user (shipped recipe: bounds, negatives, guards)")]
    learnt[gem] = cross[("GPT-4o -> Gemini", "logistic: both + char n-grams of the user's last message")]
    for name in sorted(set(rows.model[gpt])):
        held = gpt & (rows.model == name)
        held_out[held] = rule_user(gpt & ~held, held)[held]
        learnt[held] = ngram_learner(rows, gpt & ~held, held, learner="logistic", C=args.C, **best_parts)
    for mask, judge, fitted_on in ((first & gem, "Gemini", "GPT-4o"), (first & gpt, "GPT-4o", "5 others")):
        if mask.any():
            out(
                row(
                    f"rule user (fitted on {fitted_on}) vs {judge}, on {judge}'s replies",
                    agreement(held_out[mask], rows.change[mask]).as_dict(),
                )
            )
            out(
                row(
                    f"logistic, both + last message (fitted on {fitted_on}) vs {judge}",
                    agreement(learnt[mask], rows.change[mask]).as_dict(),
                    mae=False,
                )
            )
    out("")
    out("by the reply's turn (GPT-4o, leave one model out): from turn 2 on the logged emotion and the last")
    out("change (momentum) are known to the appraiser; at turn 1 only the persona and the reply are")
    out(
        f"{'turn':5s} {'turns':>5s}  {'rule user: sign  kappa  spear  share +':38s}  "
        "logistic (both + last): sign  kappa  "
        "spear   logged share +"
    )
    turn = np.array([request.turn for request in rows.requests])
    for t in sorted(set(turn[gpt])):
        mask = gpt & (turn == t)
        ours, theirs = (agreement(values[mask], rows.change[mask]).as_dict() for values in (held_out, learnt))
        out(
            f"{t:<5d} {int(mask.sum()):5d}  {'':11s}{ours['sign_agreement']:6.3f} {ours['cohen_kappa']:6.3f} "
            f"{ours['spearman']:6.3f} {np.mean(held_out[mask] > 0):8.2f}  {'':28s}{theirs['sign_agreement']:6.3f} "
            f"{theirs['cohen_kappa']:6.3f} {theirs['spearman']:6.3f} {np.mean(rows.change[mask] > 0):8.2f}"
        )
    out("")
    out("tried and withdrawn (commit 0223fb4): the first reply with weights of its own (a first|<name> copy of")
    out("every reply feature on turn 1, fit_rule_model.py). Held out it agreed better everywhere: first replies")
    out("0.650 / kappa 0.195 / Spearman 0.233, leave one model out 0.773 / 0.513 / 0.521, GPT-4o -> Gemini")
    out("0.662 / 0.336 / 0.435, Gemini -> GPT-4o 0.656 / 0.333 / 0.392. But the main recipe's policy (SmolLM2,")
    out("GRPO, one reply a dialogue) learnt against it 'I'm here. What? I'm here. I don't.' (+1.55 a reply;")
    out("the repetition guard now catches it), then strings of 'What's the problem? What's the issue?' mixed")
    out("with foreign-language gibberish (+2.42 held out). The shipped user does without.")
    out("")
    lines.extend(part2)
    out(f"took {time.time() - started:.0f} s")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
