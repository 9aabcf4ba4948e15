"""``empathy-gym distill``: train an appraiser (:mod:`empathy_gym.user.appraiser`) from the
logs of an LLM simulator, and report how well it agrees with that simulator on tested
models it never saw (docs/simulated-user.md, "The distilled user").

1. **Features** (the slow part, resumable): every appraised turn of the logs (SAGE's
   result logs, our ``transcripts.jsonl`` / ``episodes.jsonl``) goes through the base model
   once, turn by turn with each dialogue's prefix cached; at ``bad_turns`` turns a dialogue
   the same context also gets bad replies (:mod:`empathy_gym.user.probes`), and contexts
   of the English bank's training personas get a fluent reply beside bad ones (no LLM
   label: they only rank). Shards of ``shard_dialogues`` dialogues are written atomically
   to ``FOLDER/features/``; a rerun skips finished shards.
2. **Head** (seconds): :func:`fit_head` on the training split, for the report; then on
   every row, for the saved appraiser.
3. **Report**: agreement on the held-out tested models beside the shipped rule user and a
   lexical learner, bad replies scored below their context's reply, the calibration of
   P(gain), and a model card. (Across simulator families: ``benchmarks/distill_appraiser.py``.)

The split is by tested model (a log file's ``model``), never by turn: turns of one
dialogue share their context.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from empathy_gym.user.appraiser import (
    BINS,
    Appraiser,
    AppraiserConfig,
    Head,
    Layout,
    default_layout,
    expected_change,
    load_base_model,
    save_head,
    softmax,
)
from empathy_gym.user.distill_rows import (
    FLUENT,
    LOGGED,
    Context,
    Rows,
    bank_contexts,
    english_bank_split,
    extract,
    load_rows,
    logged_contexts,
    opening_contexts,
    save_rows,
    subset,
)
from empathy_gym.user.probes import BAD_KINDS


@dataclass(frozen=True)
class HeadOptions:
    """How :func:`fit_head` fits the head.

    Attributes:
        C: inverse L2 strength on the named features' weights (scikit-learn's convention:
            the loss is the sum over rows plus ``||W||^2 / (2 C)``).
        C_states: the same for the language model's features (many more columns).
        bad_weight: weight of a bad reply's row in the cross-entropy towards -10.
        rank_weight: weight of each (reply, bad reply in its context) pair in the ranking
            loss ``relu(mean_bad - mean_reply + margin)^2 / 25``, means in emotion points.
        margin: the ranking margin, in emotion points.
        use_states: False fits the named features alone (an ablation: no language model).
        steps: L-BFGS iterations.
    """

    C: float = 0.3
    C_states: float = 0.001
    bad_weight: float = 0.0
    rank_weight: float = 1.0
    margin: float = 5.0
    use_states: bool = True
    steps: int = 300


def bin_index(change: np.ndarray) -> np.ndarray:
    """(n,) changes -> (n,) int64 index of the nearest of :data:`~empathy_gym.user.appraiser.BINS`."""
    bins = np.asarray(BINS, dtype=float)
    return np.abs(np.asarray(change, dtype=float)[:, None] - bins[None]).argmin(axis=1)


def fit_head(rows: Rows, options: HeadOptions = HeadOptions(), *, seed: int = 0) -> Head:
    """Fit the head (:mod:`empathy_gym.user.appraiser`) on ``rows``: multinomial
    logistic regression of the logged change's bin (Cox 1966) on the standardised states
    and the named features, with bad replies ranked below the reply of their context (and
    optionally rows of bin -10; :class:`HeadOptions`), by full-batch L-BFGS; then the bias
    alone refitted on the logged rows, so that the ranking leaves the logs' base rates as
    they are. Deterministic: the same rows and ``seed`` give the same head.

    Raises:
        ValueError: no labelled rows.
    """
    import torch

    labelled = ~np.isnan(rows.change)
    if not labelled.any():
        raise ValueError("fit_head: no rows with a logged change")
    torch.manual_seed(seed)
    vocabulary = sorted({name for named in rows.named for name in named})
    states = rows.states if options.use_states else np.zeros((len(rows.kind), 0), dtype=np.float32)
    mean = states.mean(axis=0)
    scale = states.std(axis=0) + 1e-3
    head = Head(vocabulary, mean, scale, np.zeros((len(BINS), states.shape[1] + len(vocabulary))), np.zeros(len(BINS)))
    x = torch.from_numpy(np.concatenate([head.standardised(states), head.named_matrix(rows.named)], axis=1)).float()
    bad = np.isin(rows.kind, BAD_KINDS)
    targets = torch.from_numpy(np.where(labelled, bin_index(np.nan_to_num(rows.change)), 0))
    weights = torch.from_numpy(np.where(labelled, 1.0, np.where(bad, options.bad_weight, 0.0))).float()
    penalty = torch.cat(
        [torch.full((states.shape[1],), 1 / options.C_states), torch.full((len(vocabulary),), 1 / options.C)]
    )
    pairs = _rank_pairs(rows)
    values = torch.tensor(BINS, dtype=torch.float32)
    weight = torch.zeros((len(BINS), x.shape[1]), requires_grad=True)
    bias = torch.zeros(len(BINS), requires_grad=True)

    def objective(logits: torch.Tensor, row_weights: torch.Tensor) -> torch.Tensor:
        cross = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
        total = (row_weights * cross).sum()
        if len(pairs) and options.rank_weight:
            means = torch.softmax(logits, dim=1) @ values
            gap = means[pairs[:, 1]] - means[pairs[:, 0]] + options.margin
            total = total + options.rank_weight * (torch.relu(gap) ** 2).sum() / 25.0
        return total

    def minimise(parameters: list[torch.Tensor], value) -> None:
        optimiser = torch.optim.LBFGS(parameters, max_iter=options.steps, line_search_fn="strong_wolfe")

        def closure() -> torch.Tensor:
            optimiser.zero_grad()
            total = value()
            total.backward()
            return total

        optimiser.step(closure)

    minimise([weight, bias], lambda: objective(x @ weight.T + bias, weights) + (penalty * weight**2).sum() / 2)
    fixed = (x[labelled] @ weight.detach().T).detach()
    logged_targets = targets[labelled]
    minimise([bias], lambda: torch.nn.functional.cross_entropy(fixed + bias, logged_targets, reduction="sum"))
    head.weight = weight.detach().numpy().astype(np.float32)
    head.bias = bias.detach().numpy().astype(np.float32)
    head.mean, head.scale = mean.astype(np.float32), scale.astype(np.float32)
    return head


def _rank_pairs(rows: Rows) -> torch.Tensor:  # noqa: F821  (torch is imported by the caller)
    """(P, 2) int64 row indices ``(reply, bad reply)`` of every bad reply and the logged
    or fluent reply of its context."""
    import torch

    reply_of = {
        int(context): index
        for index, (context, kind) in enumerate(zip(rows.context, rows.kind))
        if kind in (LOGGED, FLUENT)
    }
    pairs = [
        (reply_of[int(context)], index)
        for index, (context, kind) in enumerate(zip(rows.context, rows.kind))
        if kind in BAD_KINDS and int(context) in reply_of
    ]
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


def predict(head: Head, rows: Rows) -> np.ndarray:
    """(n, len(BINS)) float64: the head's distribution for every row."""
    states = rows.states if head.mean.shape[0] else np.zeros((len(rows.kind), 0), dtype=np.float32)
    return softmax(head.logits(states.astype(np.float64), head.named_matrix(rows.named)))


class DistillError(ValueError):
    """Invalid input to ``empathy-gym distill``: no appraised turns, a held-out model the
    logs lack, or a run folder that holds another configuration (the field named) or
    another kind of run (a training, eval or replay run)."""


@dataclass
class DistillResult:
    """What :func:`distill` made: the folder, the head, the report's text and numbers.

    Attributes:
        folder: the appraiser folder (``appraiser.json``, ``head.safetensors``, reports).
        report: ``report.json``'s content. text: ``report.txt``'s.
        resumed: feature shards found done.
    """

    folder: Path
    report: dict[str, Any]
    text: str
    resumed: int


def distill(
    logs: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    base_model: str = "smollm2",
    personas: Any = None,
    heldout_models: Sequence[str] | None = None,
    layout: Layout | None = None,
    head: HeadOptions = HeadOptions(),
    bad_turns: int = 2,
    bank_turns: int = 4,
    seed: int = 0,
    device: str = "cpu",
    batch_size: int = 16,
    shard_dialogues: int = 16,
    on_progress: Callable[[int, int], None] | None = None,
) -> DistillResult:
    """Train an appraiser from logs into ``out`` (module docstring) and report its agreement
    on held-out tested models.

    Args:
        logs: SAGE result logs, our ``transcripts.jsonl`` / ``episodes.jsonl``, or folders
            of them (:func:`~empathy_gym.evaluation.replay.read_logs`).
        out: the appraiser folder; a rerun with the same settings resumes.
        base_model: a path, hub id, ``.gguf`` file or ``smollm2`` / ``tiny``.
        personas: the bank our own logs were played with (``None``: from their run).
        heldout_models: tested models (log ``model`` names) held out for the report
            (default: a fifth of them, at least one, drawn with ``seed``).
        layout, head: what the model reads (default: :func:`~empathy_gym.user.appraiser.default_layout`
            for the base model's depth) and how the head is fitted.
        bad_turns: turns a logged dialogue whose context also gets four bad replies.
        bank_turns: turns of each English training persona's dialogue with the scripted
            listener (fluent reply and every bad kind; 0: none). Each profile's first
            logged reply also gets every bad kind.
        on_progress: called with ``(turns done, turns in all)``.

    Returns:
        :class:`DistillResult`. The saved head is fitted on every row; the report's
        numbers come from a head fitted on the training split only.

    Raises:
        DistillError: as its docstring says. SageLogError: a malformed log line (file,
        line, field). FileNotFoundError: a missing log. OSError: a base model that does
        not load (named).
    """
    from empathy_gym.evaluation.replay import read_logs
    from empathy_gym.evaluation.run_folder import FEATURES, check_holds_no_other, check_run_config, write_json

    folder = Path(out)
    layout = layout or default_layout(base_model_layers(base_model))
    files = read_logs(logs, personas=personas)
    names = sorted({log.model for log in files})
    held = _heldout_models(names, heldout_models, seed)
    config = {
        "logs": [log.name for log in files],
        "base_model": base_model,
        "layout": dataclasses.asdict(layout),
        "bad_turns": bad_turns,
        "bank_turns": bank_turns,
        "seed": seed,
        "shard_dialogues": shard_dialogues,
        "bad_kinds": list(BAD_KINDS),  # shards made with other kinds are not resumed
    }
    if folder.exists() and not folder.is_dir():
        raise DistillError(f"--out {str(folder)!r} is a file; give a folder (new, or a run to resume)")
    check_holds_no_other(folder, "distill", error=DistillError)
    check_run_config(folder, config)
    logged = logged_contexts(files, bad_turns=bad_turns, seed=seed)
    if not logged:
        raise DistillError(f"{', '.join(map(str, logs))}: no appraised turns to learn from")
    bank = bank_contexts(english_bank_split(seed)[0], turns=bank_turns, seed=seed) if bank_turns else []
    parts = (logged, bank, opening_contexts(files))
    shards = [part[i : i + shard_dialogues] for part in parts for i in range(0, len(part), shard_dialogues)]
    paths = [folder / FEATURES / f"{index:04d}.npz" for index in range(len(shards))]
    resumed = sum(path.exists() for path in paths)
    folder.joinpath(FEATURES).mkdir(parents=True, exist_ok=True)
    write_json(folder / "run.json", config)
    _extract_missing(shards, paths, base_model, layout, device, batch_size, seed, on_progress)
    rows = Rows.concatenate([load_rows(path) for path in paths])
    return _fit_and_report(folder, rows, config, held, head, seed, resumed)


def base_model_layers(name: str) -> int:
    """How many decoder layers the base model ``name`` has (from its config alone).

    Raises:
        OSError: naming the base model, when its config cannot be read.
    """
    from transformers import AutoConfig

    from empathy_gym.backends.models import resolve_model

    try:
        path, gguf_file = resolve_model(name)
        config = AutoConfig.from_pretrained(path, gguf_file=gguf_file)
    except (OSError, ValueError) as error:
        raise OSError(f"base model {name!r} could not be loaded: {error}") from None
    return int(config.num_hidden_layers)


def _heldout_models(names: Sequence[str], wanted: Sequence[str] | None, seed: int) -> list[str]:
    if wanted:
        missing = sorted(set(wanted) - set(names))
        if missing:
            raise DistillError(f"--heldout-model: {missing} not among the logs' tested models {names}")
        return sorted(wanted)
    if len(names) < 2:
        raise DistillError(f"the logs hold one tested model ({names}): a held-out split by model needs two or more")
    count = max(1, round(len(names) / 5))
    return sorted(np.random.default_rng(seed).choice(names, size=count, replace=False).tolist())


def _extract_missing(
    shards: Sequence[Sequence[Sequence[Context]]],
    paths: Sequence[Path],
    base_model: str,
    layout: Layout,
    device: str,
    batch_size: int,
    seed: int,
    on_progress: Callable[[int, int], None] | None,
) -> None:
    """Extract and save every shard not on disk (the base model loaded only when one is missing)."""
    total = sum(len(dialogue) for shard in shards for dialogue in shard)
    done = sum(len(dialogue) for shard, path in zip(shards, paths) if path.exists() for dialogue in shard)
    if on_progress is not None:
        on_progress(done, total)
    if done == total:
        return
    try:
        model, tokenizer = load_base_model(base_model, device=device)
    except OSError as error:
        raise OSError(f"base model {base_model!r} could not be loaded: {error}") from None
    appraiser = Appraiser(model, tokenizer, layout, batch_size=batch_size, cache_tokens=65536)  # 16 dialogues

    def advance(turns: int) -> None:
        nonlocal done
        done += turns
        if on_progress is not None:
            on_progress(done, total)

    for index, (shard, path) in enumerate(zip(shards, paths)):
        if not path.exists():
            save_rows(path, extract(appraiser, shard, seed=seed + index * len(shards[0]), on_turns=advance))


def lexical_learner(train: Rows, test: Rows, C: float = 0.3) -> np.ndarray | None:
    """Decision values on ``test`` of the best lexical learner of
    ``benchmarks/results/agreement_ceiling.txt``: L2 logistic regression of the change's
    sign on the named features and character n-grams of the reply (1-3) and of the user's
    last message (1-2), fitted on ``train``'s logged rows; ``None`` without scikit-learn."""
    try:
        from scipy import sparse
        from sklearn.feature_extraction import DictVectorizer
        from sklearn.feature_extraction.text import CountVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import normalize
    except ImportError:
        return None
    fit_rows = ~np.isnan(train.change) & (np.nan_to_num(train.change) != 0)
    blocks_train, blocks_test = [], []
    for texts, ngrams in (("reply", (1, 3)), ("last_user", (1, 2))):
        vectoriser = CountVectorizer(analyzer="char", ngram_range=ngrams, binary=True, min_df=3)
        blocks_train.append(normalize(vectoriser.fit_transform(getattr(train, texts)[fit_rows]).astype(float)))
        blocks_test.append(normalize(vectoriser.transform(getattr(test, texts)).astype(float)))
    vectoriser = DictVectorizer()
    blocks_train.append(vectoriser.fit_transform([n for n, keep in zip(train.named, fit_rows) if keep]))
    blocks_test.append(vectoriser.transform(test.named))
    model = LogisticRegression(C=C, max_iter=5000)
    model.fit(sparse.hstack(blocks_train).tocsr(), np.sign(train.change[fit_rows]))
    return model.decision_function(sparse.hstack(blocks_test).tocsr())


def bad_below(rows: Rows, scores: np.ndarray) -> dict[str, float]:
    """Per bad kind, the share of bad replies scored below the logged or fluent reply of
    their context (``scores``: (n,) one score per row, e.g. the mean change); ``"all"``
    over every bad reply."""
    pairs = _rank_pairs(rows).numpy()
    if not len(pairs):
        return {}
    below = scores[pairs[:, 1]] < scores[pairs[:, 0]]
    kinds = rows.kind[pairs[:, 1]]
    shares = {kind: float(below[kinds == kind].mean()) for kind in BAD_KINDS if (kinds == kind).any()}
    return {**shares, "all": float(below.mean())}


def _fit_and_report(
    folder: Path, rows: Rows, config: dict[str, Any], held: Sequence[str], options: HeadOptions, seed: int, resumed: int
) -> DistillResult:
    """Fit on the training split and report on the held-out models; then fit on every row
    and save the appraiser."""
    from empathy_gym.evaluation.replay import agreement
    from empathy_gym.evaluation.run_folder import write_json

    test = np.isin(rows.model, held) & (rows.kind != FLUENT)
    train_rows, test_rows = subset(rows, ~test), subset(rows, test)
    held_head = fit_head(train_rows, options, seed=seed)
    distribution = predict(held_head, test_rows)
    mean = expected_change(distribution)
    logged = ~np.isnan(test_rows.change)
    models = test_rows.model[logged].tolist()
    judges = {"distilled appraiser": mean[logged], "rule user (shipped)": test_rows.rule_change[logged]}
    lexical = lexical_learner(train_rows, test_rows)
    if lexical is not None:
        judges["lexical learner"] = lexical[logged]
    report = {
        "heldout_models": list(held),
        "rows": {
            "logged": int((~np.isnan(rows.change)).sum()),
            "bad": int(np.isin(rows.kind, BAD_KINDS).sum()),
            "fluent": int((rows.kind == FLUENT).sum()),
        },
        "agreement": {
            name: agreement(values, test_rows.change[logged], models).as_dict() for name, values in judges.items()
        },
        "bad_below_reply": {
            "distilled appraiser": bad_below(test_rows, mean),
            "rule user (shipped)": bad_below(test_rows, test_rows.rule_change),
        },
        "calibration": calibration(distribution[logged], test_rows.change[logged]),
        "options": dataclasses.asdict(options),
    }
    head = fit_head(rows, options, seed=seed)
    trained_on = {
        **config,
        "heldout_models_in_report": list(held),
        "rows": report["rows"],
        "head": dataclasses.asdict(options),
    }
    save_head(folder, AppraiserConfig(config["base_model"], config["layout"], trained_on), head)
    text = report_text(folder, report)
    write_json(folder / "report.json", report)
    (folder / "report.txt").write_text(text, encoding="utf-8")
    (folder / "MODEL_CARD.md").write_text(model_card(config, report, text), encoding="utf-8")
    plot_calibration(report["calibration"], folder / "calibration.png")
    return DistillResult(folder, report, text, resumed)


def calibration(distribution: np.ndarray, logged: np.ndarray, groups: int = 10) -> list[dict[str, float]]:
    """Reliability of P(change > 0): the held-out turns in ``groups`` groups of equal size by
    predicted probability, each with its mean prediction and the observed share of gains."""
    gain = distribution[:, np.asarray(BINS) > 0].sum(axis=1)
    order = np.argsort(gain, kind="stable")
    return [
        {"predicted": float(gain[part].mean()), "observed": float((logged[part] > 0).mean()), "turns": int(len(part))}
        for part in np.array_split(order, groups)
        if len(part)
    ]


def plot_calibration(points: Sequence[dict[str, float]], path: Path) -> None:
    """The reliability diagram of :func:`calibration` as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(4, 4))
    axes.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1)
    axes.plot([p["predicted"] for p in points], [p["observed"] for p in points], marker="o")
    axes.set_xlabel("predicted P(change > 0)")
    axes.set_ylabel("observed share of gains")
    axes.set_title("held-out turns, in tenths")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def report_text(folder: Path, report: dict[str, Any]) -> str:
    """``report.txt``: the agreement table, the bad replies and the calibration."""
    lines = [
        f"Distilled appraiser in {folder.name}: held-out tested models {', '.join(report['heldout_models'])} "
        "(the head below was fitted on the other models' turns; the saved head on all of them)",
        f"rows: {report['rows']['logged']} logged turns, {report['rows']['bad']} bad replies, "
        f"{report['rows']['fluent']} fluent replies of the English bank",
        f"{'judge':32s} {'turns':>6s} {'sign':>6s} {'chance':>6s} {'kappa':>6s} {'spear':>6s} {'tau':>6s}",
    ]
    for name, result in report["agreement"].items():
        tau = result["kendall_tau"]
        lines.append(
            f"{name:32s} {result['turns']:6d} {result['sign_agreement']:6.3f} {result['chance_agreement']:6.3f} "
            f"{result['cohen_kappa']:6.3f} {result['spearman']:6.3f} {'     -' if tau is None else f'{tau:+6.2f}'}"
        )
    lines.append("(the shipped rule user was fitted on SAGE's logs: on them it is in-sample)")
    for name, shares in report["bad_below_reply"].items():
        if shares:
            kinds = ", ".join(f"{kind} {share:.2f}" for kind, share in shares.items())
            lines.append(f"bad replies scored below their context's reply, {name}: {kinds}")
    cal = ", ".join(f"{p['predicted']:.2f}->{p['observed']:.2f}" for p in report["calibration"])
    lines.append(f"calibration of P(gain), predicted -> observed by tenths: {cal}")
    return "\n".join(lines) + "\n"


def model_card(config: dict[str, Any], report: dict[str, Any], text: str) -> str:
    """``MODEL_CARD.md``: what the appraiser was trained on, how it was measured, and where
    it is known to fail."""
    logs = "\n".join(f"- `{name}`" for name in config["logs"])
    kinds = ", ".join(config.get("bad_kinds", ())).replace("_", " ")
    return f"""# Distilled appraiser

A head on the hidden states of `{config["base_model"]}` (frozen; the first
{config["layout"]["depth"] or "all"} layers run) and on the rule user's named features,
predicting the emotion change an LLM simulator gives an agent's reply (-10, -5, 0, +5, +10;
the change is the distribution's mean). Made by `empathy-gym distill` (empathy_gym.user.distill).

## Trained on
{logs}

{report["rows"]["logged"]} logged turns, with {report["rows"]["bad"]} bad replies ranked below the
logged reply of their context, and {report["rows"]["fluent"]} fluent replies of the English bank's
training personas (ranked above bad ones; no label). Seed {config["seed"]}. The bad replies' kinds
(empathy_gym.user.probes says what each is): {kinds}.

## Measured
On tested models held out from the fit ({", ".join(report["heldout_models"])}); the saved head
was then fitted on every turn:

```
{text.rstrip()}
```

## Where it fails
- It learnt what these simulators pay on these logs: other simulators, personas and
  tested models far from them may be judged differently; per turn, even two LLM simulator
  families agree with each other little.
- The base model is small: it reads a long message's head and tail only, and its reading
  of a language it was not trained on (SmolLM2 and Chinese) is weak; much of the signal is
  in the named features and the user's state (emotion, turn, trend).
- English judgements, where the logs are Chinese, rest on the named features and on the
  ranked bad replies, not on English logs.
- A policy trained against it can find what it overpays (the quick start's recipe did,
  against every appraiser shipped so far): train against `distilled,pessimistic=true`,
  which pays the lower of its change and the rule user's, with a second judge and the
  reward-hacking monitors (docs/simulated-user.md, docs/reward-hacking.md).
"""
