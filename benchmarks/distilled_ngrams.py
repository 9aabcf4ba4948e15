"""A trial the shipped appraiser does not use: character n-grams inside the distilled head,
and how sure the cross-family comparison with the lexical learner is.

    python benchmarks/distilled_ngrams.py [--work runs/distill-sage-v3] [--C 0 1 3 10 30] [--no-write]

The lexical learner of ``agreement_ceiling.txt`` (char n-grams of the reply and the user's
last message) agrees with an unseen simulator family about as well as the distilled
appraiser (``distilled_agreement.txt``). Here the head's own objective
(:func:`empathy_gym.user.distill.fit_head`: bins, ranking of bad replies, bias refit) gets
one more block of columns: the same n-grams, hashed (``HashingVectorizer``, 2^12 columns
each for the reply's 1-3-grams and the last message's 1-2-grams, binary, L2-normalised),
with their own L2 strength ``1 / C`` (``C = 0``: the block left out, the shipped head's
fit). Each variant is fitted on one family's turns (and the English fluent rows) and
scored on every turn of the other, both ways, beside the lexical learner fitted on the
same rows.

The interval on kappa(head) - kappa(lexical learner) is a paired bootstrap over the
held-out family's dialogues (2,000 resamples, percentiles 2.5 and 97.5): a difference whose
interval holds 0 is not one the data can tell.

Reads the base model's features saved by ``empathy-gym distill`` (``--work``; made by
``benchmarks/distill_appraiser.py``); writes ``benchmarks/results/distilled_ngrams.txt``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _machine import cpu_model, provenance, publish  # noqa: E402
from fit_rule_model import GEMINI, GPT  # noqa: E402

from empathy_gym.evaluation.replay import agreement  # noqa: E402
from empathy_gym.user.appraiser import BINS, Head, expected_change, softmax  # noqa: E402
from empathy_gym.user.distill import HeadOptions, _rank_pairs, bad_below, bin_index, lexical_learner  # noqa: E402
from empathy_gym.user.distill_rows import FLUENT, Rows, load_rows, subset  # noqa: E402

BITS = 12


def ngrams(rows: Rows) -> np.ndarray:
    """(n, 2 * 2^BITS) float32: hashed char n-grams of the reply (1-3) and the last message (1-2)."""
    from sklearn.feature_extraction.text import HashingVectorizer

    blocks = []
    for texts, span in ((rows.reply, (1, 3)), (rows.last_user, (1, 2))):
        vectoriser = HashingVectorizer(
            analyzer="char", ngram_range=span, n_features=2**BITS, alternate_sign=False, binary=True, norm="l2"
        )
        blocks.append(vectoriser.transform(list(texts)).toarray().astype(np.float32))
    return np.concatenate(blocks, axis=1)


def fit_with_ngrams(rows: Rows, grams: np.ndarray, C: float, options: HeadOptions | None = None):
    """fit_head's objective with the n-gram block (L2 strength 1 / C) beside the states and
    the named features; ``C == 0`` leaves the block out. Returns a predict function."""
    import torch

    options = options or HeadOptions()
    labelled = ~np.isnan(rows.change)
    vocabulary = sorted({name for named in rows.named for name in named})
    mean, scale = rows.states.mean(axis=0), rows.states.std(axis=0) + 1e-3
    head = Head(vocabulary, mean, scale, np.zeros((len(BINS), 0)), np.zeros(len(BINS)))
    width = grams.shape[1] if C else 0

    def design(part: Rows, part_grams: np.ndarray) -> np.ndarray:
        return np.concatenate(
            [head.standardised(part.states), head.named_matrix(part.named), part_grams[:, :width]], axis=1
        )

    x = torch.from_numpy(design(rows, grams)).float()
    targets = torch.from_numpy(np.where(labelled, bin_index(np.nan_to_num(rows.change)), 0))
    weights = torch.from_numpy(labelled.astype(np.float32))
    penalty = torch.cat(
        [
            torch.full((rows.states.shape[1],), 1 / options.C_states),
            torch.full((len(vocabulary),), 1 / options.C),
            torch.full((width,), 1 / C if C else 0.0),
        ]
    )
    pairs, values = _rank_pairs(rows), torch.tensor(BINS, dtype=torch.float32)
    weight = torch.zeros((len(BINS), x.shape[1]), requires_grad=True)
    bias = torch.zeros(len(BINS), requires_grad=True)

    def minimise(parameters, value) -> None:
        optimiser = torch.optim.LBFGS(parameters, max_iter=options.steps, line_search_fn="strong_wolfe")

        def closure():
            optimiser.zero_grad()
            total = value()
            total.backward()
            return total

        optimiser.step(closure)

    def objective():
        logits = x @ weight.T + bias
        total = (weights * torch.nn.functional.cross_entropy(logits, targets, reduction="none")).sum()
        gap = (torch.softmax(logits, 1) @ values)[pairs[:, 1]] - (torch.softmax(logits, 1) @ values)[pairs[:, 0]]
        total = total + options.rank_weight * (torch.relu(gap + options.margin) ** 2).sum() / 25.0
        return total + (penalty * weight**2).sum() / 2

    minimise([weight, bias], objective)
    fixed, logged_targets = (x[labelled] @ weight.detach().T).detach(), targets[labelled]
    minimise([bias], lambda: torch.nn.functional.cross_entropy(fixed + bias, logged_targets, reduction="sum"))
    w, b = weight.detach().numpy(), bias.detach().numpy()
    return lambda part, part_grams: expected_change(softmax(design(part, part_grams) @ w.T + b))


def sign_kappa(predicted: np.ndarray, logged: np.ndarray) -> float:
    """Cohen's kappa of the signs (-, 0, +), as ``agreement``'s ``cohen_kappa``."""
    p, q = np.sign(predicted), np.sign(logged)
    observed = float((p == q).mean())
    chance = sum(float((p == s).mean() * (q == s).mean()) for s in (-1.0, 0.0, 1.0))
    return (observed - chance) / (1 - chance) if chance < 1 else 0.0


def kappa_gap_interval(head: np.ndarray, lexical: np.ndarray, logged: np.ndarray, dialogues: np.ndarray, seed: int = 0):
    """Paired bootstrap over dialogues: 95% percentile interval of kappa(head) - kappa(lexical)."""
    names, index = np.unique(dialogues, return_inverse=True)
    members = [np.flatnonzero(index == i) for i in range(len(names))]
    rng = np.random.default_rng(seed)
    gaps = []
    for _ in range(2000):
        rows = np.concatenate([members[i] for i in rng.integers(0, len(members), len(members))])
        gaps.append(sign_kappa(head[rows], logged[rows]) - sign_kappa(lexical[rows], logged[rows]))
    return np.percentile(gaps, [2.5, 97.5])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "distill-sage-v3")
    parser.add_argument("--C", type=float, nargs="+", default=[0.0, 1.0, 3.0, 10.0, 30.0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    started = time.time()
    rows = Rows.concatenate([load_rows(path) for path in sorted((args.work / "features").glob("*.npz"))])
    grams = ngrams(rows)
    lines = [
        "# Char n-grams inside the distilled head, a trial (benchmarks/distilled_ngrams.py)",
        provenance(no_inputs="reads the saved features of --work, not the shipped appraiser"),
        f"# machine: {cpu_model()}; load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        f"# features: {args.work} ({len(rows.kind)} rows); kappa gap: paired bootstrap over the held-out dialogues",
        "",
        f"{'direction':18s} {'judge':28s} {'sign':>6s} {'kappa':>6s} {'spear':>6s} {'tau':>6s} {'bad<':>5s}"
        f"  {'kappa - lexical [95%]':>24s}",
    ]
    english = rows.kind == FLUENT
    for fitted_on, scored_on, label in ((GPT, GEMINI, "GPT-4o -> Gemini"), (GEMINI, GPT, "Gemini -> GPT-4o")):
        train, test = (rows.simulator == fitted_on) | english, rows.simulator == scored_on
        train_rows, test_rows = subset(rows, train), subset(rows, test)
        logged = ~np.isnan(test_rows.change)
        change, models = test_rows.change[logged], test_rows.model[logged].tolist()
        dialogues = test_rows.dialogue[logged]
        lexical = lexical_learner(train_rows, test_rows)
        scores = {"lexical learner": lexical}
        for C in args.C:
            scores[f"head + n-grams, C={C:g}" if C else "head (shipped fit)"] = fit_with_ngrams(
                train_rows, grams[train], C
            )(test_rows, grams[test])
        for name, values in scores.items():
            result = agreement(values[logged], change, models).as_dict()
            tau = result["kendall_tau"]
            bad = "    -" if name == "lexical learner" else f"{bad_below(test_rows, values)['all']:5.2f}"
            gap = ""
            if name != "lexical learner":
                low, high = kappa_gap_interval(values[logged], lexical[logged], change, dialogues)
                gap = f"{result['cohen_kappa'] - sign_kappa(lexical[logged], change):+.3f} [{low:+.3f}, {high:+.3f}]"
            lines.append(
                f"{label:18s} {name:28s} {result['sign_agreement']:6.3f} {result['cohen_kappa']:6.3f} "
                f"{result['spearman']:6.3f} {'     -' if tau is None else f'{tau:+6.2f}'} {bad}  {gap:>24s}"
            )
        lines.append("")
    lines.append(f"took {time.time() - started:.0f} s")
    publish(lines, "distilled_ngrams.txt", write=not args.no_write)


if __name__ == "__main__":
    main()
