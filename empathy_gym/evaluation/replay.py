"""Replay logged dialogues (SAGE's, or our own) through another simulated user, and measure agreement.

Each appraised agent reply is shown to the user with the logged history and emotion before
it (:func:`reappraise`); its clamped change is compared with the logged one
(:func:`agreement`). :func:`replay_logs` is ``empathy-gym replay``: it also checks that our
protocol reproduces each logged dialogue (:func:`replay_with_logged_changes`), and a rerun
resumes from ``turns.jsonl``. See docs/evaluation.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from empathy_gym.evaluation.own_logs import OWN_LOG_NAMES, is_own_log, own_log_names, read_own_log
from empathy_gym.evaluation.run_folder import TURNS, EvaluationError, RunFolder
from empathy_gym.evaluation.sage_logs import LoggedDialogue, LoggedTurn, leaderboard, log_names, read_sage_log
from empathy_gym.personas import Persona
from empathy_gym.seeding import derive_seed
from empathy_gym.user.base import Appraisal, SimulatedUser, SimulatorError, UserRequest
from empathy_gym.user.protocol import SAGE, EmotionProtocol
from empathy_gym.user.specs import UserSpec, as_user_spec


def turn_request(turn: LoggedTurn, persona, seed: int = 0) -> UserRequest:
    """The request our user gets for a logged turn: the logged history, reply and emotion before it."""
    return UserRequest(
        persona=persona,
        history=turn.history,
        utterance=turn.utterance,
        emotion=turn.emotion_before,
        turn=turn.turn,
        seed=seed,
    )


def _appraise_in_batches(
    user: SimulatedUser, requests: Sequence[UserRequest], batch_size: int
) -> Iterator[list[Appraisal]]:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for start in range(0, len(requests), batch_size):
        yield user.appraise(requests[start : start + batch_size])


def reappraise(
    user: SimulatedUser,
    requests: Sequence[UserRequest],
    *,
    protocol: EmotionProtocol = SAGE,
    batch_size: int = 64,
    on_batch: Callable[[int], None] | None = None,
) -> list[int]:
    """Our user's change for each logged turn, clamped by ``protocol`` (SAGE: [-10, 10]).

    Args:
        user: any :class:`~empathy_gym.user.base.SimulatedUser`; only its appraisal is used.
        requests: one per logged turn (:func:`turn_request`).
        batch_size: requests per :meth:`~empathy_gym.user.base.SimulatedUser.appraise` call.
        on_batch: called with the number of requests done after each batch (progress).

    Returns:
        One int per request.

    Raises:
        SimulatorError: the user could not appraise a turn.
        ValueError: ``batch_size`` < 1.
    """
    changes: list[int] = []
    for appraisals in _appraise_in_batches(user, requests, batch_size):
        changes += [protocol.clamp_change(a.change) for a in appraisals]
        if on_batch is not None:
            on_batch(len(appraisals))
    return changes


@dataclass(frozen=True)
class Agreement:
    """How a user's changes agree with the logged ones (see :func:`agreement`)."""

    turns: int
    sign_agreement: float
    sign_agreement_nonzero: float
    chance_agreement: float
    cohen_kappa: float
    spearman: float
    pearson: float
    mae: float
    confusion: dict[str, dict[str, int]]
    per_model: dict[str, dict[str, float]]
    kendall_tau: float | None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def agreement(predicted: Sequence[float], logged: Sequence[float], models: Sequence[str] | None = None) -> Agreement:
    """Agreement of predicted and logged per-turn emotion changes.

    Args:
        predicted, logged: (n,) changes, one per turn (ints in [-10, 10] under SAGE).
        models: (n,) the tested model of each turn's log file; with two or more models
            the ranking of the models by mean predicted change is compared with their
            ranking by mean logged change (Kendall's tau-b).

    Returns:
        :class:`Agreement` with: ``sign_agreement`` the share of turns whose signs
        (-, 0, +) are equal; ``sign_agreement_nonzero`` the same over turns with a
        non-zero logged change; ``chance_agreement`` the agreement expected from the two
        sign marginals alone, and ``cohen_kappa`` (Cohen 1960: (p_o - p_e) / (1 - p_e),
        ``sklearn.metrics.cohen_kappa_score``'s formula); ``spearman``, ``pearson``
        (``scipy.stats``; NaN when either side is constant); ``mae`` in emotion points;
        ``confusion[logged sign][predicted sign]`` counts; ``per_model[model]`` with
        ``turns``, ``mean_predicted``, ``mean_logged`` and ``sign_agreement``;
        ``kendall_tau`` (``scipy.stats.kendalltau``; ``None`` with fewer than two models).

    Raises:
        ValueError: empty input or lengths that differ.
    """
    from scipy import stats

    predicted_a = np.asarray(predicted, dtype=float)
    logged_a = np.asarray(logged, dtype=float)
    if (
        len(predicted_a) == 0
        or len(predicted_a) != len(logged_a)
        or (models is not None and len(models) != len(logged_a))
    ):
        raise ValueError(
            f"agreement needs equal, non-empty lengths: {len(predicted_a)} predicted, "
            f"{len(logged_a)} logged" + (f", {len(models)} models" if models is not None else "")
        )
    p_sign, l_sign = np.sign(predicted_a).astype(int), np.sign(logged_a).astype(int)
    observed = float(np.mean(p_sign == l_sign))
    nonzero = l_sign != 0
    labels = (-1, 0, 1)
    chance = float(sum(np.mean(p_sign == s) * np.mean(l_sign == s) for s in labels))
    kappa = (observed - chance) / (1 - chance) if chance < 1 else float("nan")
    constant = np.ptp(predicted_a) == 0 or np.ptp(logged_a) == 0
    spearman = float("nan") if constant else float(stats.spearmanr(predicted_a, logged_a).statistic)
    pearson = float("nan") if constant else float(stats.pearsonr(predicted_a, logged_a).statistic)
    names = {-1: "-", 0: "0", 1: "+"}
    confusion = {names[a]: {names[b]: int(np.sum((l_sign == a) & (p_sign == b))) for b in labels} for a in labels}
    per_model: dict[str, dict[str, float]] = {}
    tau = None
    if models is not None:
        models_a = np.asarray(models)
        for model in sorted(set(models_a.tolist())):
            rows = models_a == model
            per_model[model] = {
                "turns": int(rows.sum()),
                "mean_predicted": float(predicted_a[rows].mean()),
                "mean_logged": float(logged_a[rows].mean()),
                "sign_agreement": float(np.mean(p_sign[rows] == l_sign[rows])),
            }
        if len(per_model) >= 2:
            tau = float(
                stats.kendalltau(
                    [m["mean_predicted"] for m in per_model.values()], [m["mean_logged"] for m in per_model.values()]
                ).statistic
            )
    return Agreement(
        turns=len(predicted_a),
        sign_agreement=observed,
        sign_agreement_nonzero=float(np.mean(p_sign[nonzero] == l_sign[nonzero])) if nonzero.any() else float("nan"),
        chance_agreement=chance,
        cohen_kappa=float(kappa),
        spearman=spearman,
        pearson=pearson,
        mae=float(np.mean(np.abs(predicted_a - logged_a))),
        confusion=confusion,
        per_model=per_model,
        kendall_tau=tau,
    )


class LoggedUser(SimulatedUser):
    """A simulated user that replays SAGE's logs: at agent turn t of the dialogue of a
    persona id it proposes the logged change and answers with the logged user message
    (:func:`replay_with_logged_changes`).

    Args:
        dialogues: the logged dialogues (:func:`~empathy_gym.evaluation.sage_logs.read_sage_log`);
            persona ids must be unique among them.

    Raises:
        ValueError: two dialogues with one persona id.
        SimulatorError (from :meth:`appraise`): a turn that SAGE never appraised, or one
            the logs do not hold.
    """

    deterministic = True

    def __init__(self, dialogues: Sequence[LoggedDialogue]):
        self.turns: dict[tuple[str, int], LoggedTurn] = {}
        for dialogue in dialogues:
            persona_id = dialogue.persona.id
            if (persona_id, 1) in self.turns:
                raise ValueError(f"LoggedUser: two dialogues with persona id {persona_id!r}")
            self.turns.update({(persona_id, turn.turn): turn for turn in dialogue.turns})

    def _turn(self, request: UserRequest) -> LoggedTurn:
        turn = self.turns.get((request.persona.id, request.turn))
        if turn is None or not turn.scored:
            raise SimulatorError(
                f"dialogue {request.persona.id!r}, turn {request.turn}: "
                f"{'not in the logs' if turn is None else 'SAGE never appraised it'}"
            )
        return turn

    def opening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> list[str]:
        return [persona.opening_line or "" for persona in personas]

    def appraise(self, requests: Sequence[UserRequest]) -> list[Appraisal]:
        out = []
        for request in requests:
            turn = self._turn(request)
            change = turn.proposed_change if turn.proposed_change is not None else turn.change
            out.append(Appraisal(change=int(change), thoughts=str((turn.appraisal or {}).get("activity", ""))))
        return out

    def reply(
        self, requests: Sequence[UserRequest], appraisals: Sequence[Appraisal], emotions: Sequence[int]
    ) -> list[str]:
        return [self._turn(request).reply or "" for request in requests]


@dataclass(frozen=True)
class ProtocolReplay:
    """A logged dialogue played again through our env (:func:`replay_with_logged_changes`).

    Attributes:
        emotions: e_0 and the emotion after each step (ints).
        termination: the env's ``termination_reason`` of the last step.
        steps: env steps played.
        matches: the emotions equal the logged ones, step for step, and the env stopped
            where the log stops (the final emotion then equals SAGE's ``emo_point``).
        mismatch: why not, where it does not match: :data:`ENDS_EARLY` (the log stops
            before the protocol ends the dialogue: a run with fewer turns than the
            protocol's ``max_turns``) or :data:`EMOTIONS_DIFFER`; ``None`` where it matches.
    """

    emotions: tuple[int, ...]
    termination: str | None
    steps: int
    matches: bool
    mismatch: str | None = None


ENDS_EARLY = "the log ends before the protocol ends the dialogue"
EMOTIONS_DIFFER = "the protocol's emotions differ from the log's"


def replay_with_logged_changes(dialogue: LoggedDialogue, protocol: EmotionProtocol | str = "sage") -> ProtocolReplay:
    """Play a logged dialogue through :class:`~empathy_gym.env.EmpathyDialogueEnv` under
    ``protocol``, with the logged replies as actions against :class:`LoggedUser`.

    Under ``"sage"`` the env's emotions and stopping point should equal the log's: the
    same clamping and cap at 100, the same thresholds, the goodbye rule, and no
    appraisal of a 10th reply.
    """
    from empathy_gym.env import EmpathyDialogueEnv

    env = EmpathyDialogueEnv([dialogue.persona], user=LoggedUser([dialogue]), protocol=protocol)
    _, info = env.reset(seed=0)
    emotions = [info["emotion"]]
    reason = None
    for turn in dialogue.turns:
        if not turn.scored:
            break
        _, _, terminated, truncated, info = env.step(turn.utterance)
        emotions.append(info["emotion"])
        reason = info["termination_reason"]
        if terminated or truncated:
            break
    ended = env.dialogue.done_reason is not None
    same = tuple(emotions) == tuple(dialogue.emotions)
    mismatch = None if same and ended else (EMOTIONS_DIFFER if not same else ENDS_EARLY)
    return ProtocolReplay(tuple(emotions), reason, len(emotions) - 1, mismatch is None, mismatch)


# -- the harness: empathy-gym replay ---------------------------------------------------
PLOT = "scatter.png"

#: Fields of a per-turn record that identify its turn.
TURN_KEY: tuple[str, ...] = ("log", "dialogue_id", "turn")


@dataclass(frozen=True)
class LogFile:
    """One SAGE result log read for replay.

    Attributes:
        path: the file. name: ``"<simulator>/<model>"`` (:func:`~empathy_gym.evaluation.sage_logs.log_names`),
            the log's key in the records. simulator, model: its parts.
        dialogues: the dialogues read (the first ``limit`` when a limit was given).
    """

    path: str
    name: str
    simulator: str
    model: str
    dialogues: tuple[LoggedDialogue, ...]


def read_logs(paths: Sequence[str | os.PathLike], limit: int | None = None, personas: Any = None) -> list[LogFile]:
    """Read SAGE's result logs and our own ``transcripts.jsonl`` / ``episodes.jsonl``
    (:mod:`empathy_gym.evaluation.own_logs`). A folder stands for the ``*_result.jsonl``
    files under it (sorted), or else for the run's own file in it.

    Args:
        personas: the bank our own logs were played with (``None``: the one their
            ``run.json`` names, or the ``personas.jsonl`` beside them); not used for
            SAGE's logs, which carry their profiles.

    Raises:
        SageLogError: a malformed line (file, line, field). FileNotFoundError: a missing
            path, or a folder without logs. ValueError: two files with one name, or one of
            our files without a dialogue (an eval that has finished none yet), naming it.
    """
    logs, seen = [], {}
    for path in _log_files(paths):
        own = is_own_log(path)
        if own and path.stat().st_size == 0:  # before its bank is looked for
            raise ValueError(f"{path}: no dialogue in it (a run that has finished none yet?); give another log")
        simulator, model = own_log_names(path) if own else log_names(path)
        name = f"{simulator}/{model}"
        if name in seen:
            raise ValueError(f"{path} and {seen[name]} have the same name {name!r}; replay them separately")
        seen[name] = path
        dialogues = read_own_log(path, personas, limit) if own else read_sage_log(path, limit=limit)
        logs.append(LogFile(str(path), name, simulator, model, tuple(dialogues)))
    return logs


def _log_files(paths: Sequence[str | os.PathLike]) -> list[Path]:
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            sage = sorted(path.rglob("*_result.jsonl"))
            own = [path / name for name in OWN_LOG_NAMES if (path / name).exists()][:1]  # a run writes one
            if not sage and not own:
                raise FileNotFoundError(
                    f"{path}: no *_result.jsonl files and no {' or '.join(OWN_LOG_NAMES)} in this folder"
                )
            files += sage or own
        elif not path.exists():
            raise FileNotFoundError(f"{path}: no such log file")
        else:
            files.append(path)
    return files


def turn_record(
    log: LogFile,
    dialogue: LoggedDialogue,
    turn: LoggedTurn,
    request: UserRequest,
    appraisal: Appraisal,
    protocol: EmotionProtocol,
) -> dict[str, Any]:
    """One line of ``turns.jsonl``: the turn's key (``log``, ``dialogue_id``, ``turn``),
    ``line`` (in the log), ``seed``, ``emotion_before``; ``logged_change`` (SAGE's
    applied change), ``logged_proposed`` (its appraisal's change field); ``predicted``
    (our user's change, clamped by the protocol), ``proposed`` (before clamping),
    ``thoughts``, ``analysis`` (an LLM user's analysis steps) and ``repairs`` of our
    user's appraisal."""
    return {
        "log": log.name,
        "dialogue_id": dialogue.id,
        "turn": turn.turn,
        "line": dialogue.line,
        "seed": request.seed,
        "emotion_before": turn.emotion_before,
        "logged_change": turn.change,
        "logged_proposed": turn.proposed_change,
        "predicted": protocol.clamp_change(appraisal.change),
        "proposed": appraisal.change,
        "thoughts": appraisal.thoughts,
        "analysis": dict(appraisal.analysis),
        "repairs": appraisal.repairs,
    }


def _agreement_dict(records: Sequence[Mapping[str, Any]], scores: Mapping[str, float]) -> dict[str, Any]:
    from scipy import stats

    result = agreement(
        [r["predicted"] for r in records], [r["logged_change"] for r in records], models=[r["log"] for r in records]
    ).as_dict()
    per_model = result["per_model"]
    result["kendall_tau_score"] = None
    if len(per_model) >= 2:
        predicted = [per_model[m]["mean_predicted"] for m in per_model]
        result["kendall_tau_score"] = float(stats.kendalltau(predicted, [scores[m] for m in per_model]).statistic)
    return result


def _mean(values: Sequence[Any]) -> float:
    return float(np.mean(values)) if values else float("nan")


def dialogue_agreement(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """:func:`agreement` per dialogue: the sum of the re-judging user's clamped changes
    against the sum of the logged changes over each dialogue's scored turns (the emotion
    each user would have moved the dialogue by; the replies stay the logged ones).

    Args:
        records: per-turn records (:func:`turn_record`).

    Returns:
        :meth:`Agreement.as_dict` over dialogues (``turns`` counts dialogues here;
        ``per_model`` and ``kendall_tau`` by log).

    Raises:
        ValueError: no records.
    """
    sums: dict[tuple[str, str], list[float]] = {}
    for record in records:
        pair = sums.setdefault((record["log"], record["dialogue_id"]), [0.0, 0.0])
        pair[0] += record["predicted"]
        pair[1] += record["logged_change"]
    keys = list(sums)
    return agreement([sums[k][0] for k in keys], [sums[k][1] for k in keys], models=[k[0] for k in keys]).as_dict()


def summarize_replay(
    logs: Sequence[LogFile],
    records: Sequence[Mapping[str, Any]],
    protocol_checks: Mapping[str, Sequence[ProtocolReplay]],
) -> dict[str, Any]:
    """The report of a replay: a dict with

    * ``logs``: per file ``name``, ``path``, ``simulator``, ``model``, ``dialogues``,
      SAGE's leaderboard numbers (``score``, ``success``, ``failure``:
      :func:`~empathy_gym.evaluation.sage_logs.leaderboard`); ``replayed_score`` and
      ``protocol_matches`` (:func:`replay_with_logged_changes`), ``protocol_mismatches``
      (``{why: dialogues}`` for those that do not match); ``turns`` (scored turns),
      ``mean_logged``, ``mean_predicted`` (emotion points per turn), ``sign_agreement``;
    * ``agreement``: :func:`agreement` over all turns (``per_model`` keyed by log name)
      plus ``kendall_tau_score`` (mean predicted change against the log's score);
    * ``dialogue_agreement``: :func:`dialogue_agreement`;
    * ``by_simulator``: ``agreement`` for the logs of each simulator (the user that played
      them; rankings are comparable within one simulator only).

    Raises:
        ValueError: no records.
    """
    if not records:
        raise ValueError("summarize_replay: no turns to summarize")
    by_log: dict[str, list[Mapping[str, Any]]] = {}
    for record in records:
        by_log.setdefault(record["log"], []).append(record)
    files, scores = [], {}
    for log in logs:
        board = leaderboard(log.dialogues)
        scores[log.name] = board["score"]
        checks = protocol_checks[log.name]
        rows = by_log.get(log.name, [])
        files.append(
            {
                "name": log.name,
                "path": log.path,
                "simulator": log.simulator,
                "model": log.model,
                "dialogues": board["dialogues"],
                "score": board["score"],
                "success": board["success"],
                "failure": board["failure"],
                "replayed_score": float(np.mean([c.emotions[-1] for c in checks])),
                "protocol_matches": sum(c.matches for c in checks),
                "protocol_mismatches": dict(Counter(c.mismatch for c in checks if c.mismatch)),
                "turns": len(rows),
                "mean_logged": _mean([r["logged_change"] for r in rows]),
                "mean_predicted": _mean([r["predicted"] for r in rows]),
                "sign_agreement": _mean([np.sign(r["predicted"]) == np.sign(r["logged_change"]) for r in rows]),
            }
        )
    simulators: dict[str, list[Mapping[str, Any]]] = {}
    names = {log.name: log.simulator for log in logs}
    for record in records:
        simulators.setdefault(names[record["log"]], []).append(record)
    return {
        "logs": files,
        "turns": len(records),
        "agreement": _agreement_dict(records, scores),
        "dialogue_agreement": dialogue_agreement(records),
        "by_simulator": {sim: _agreement_dict(rows, scores) for sim, rows in simulators.items()},
    }


def plot_agreement(records: Sequence[Mapping[str, Any]], path: str | os.PathLike, *, title: str | None = None) -> None:
    """Save a PNG: the logged change (x) against the predicted change (y), one circle per
    pair of values with its area proportional to the turn count (the changes are a few
    integers, so points would pile up), the diagonal dashed."""
    from collections import Counter

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = Counter((r["logged_change"], r["predicted"]) for r in records)
    xs, ys, ns = zip(*[(x, y, n) for (x, y), n in sorted(counts.items())])
    figure = Figure(figsize=(6.5, 6), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    largest = max(ns)
    axes.scatter(xs, ys, s=[1500 * n / largest for n in ns], alpha=0.5, color="tab:blue", edgecolors="tab:blue")
    for x, y, n in zip(xs, ys, ns):
        axes.annotate(str(n), (x, y), ha="center", va="center", fontsize=8)
    low = min(min(xs), min(ys)) - 2
    high = max(max(xs), max(ys)) + 2
    axes.plot([low, high], [low, high], color="gray", linestyle="--", linewidth=1)
    axes.axhline(0, color="lightgray", linewidth=0.8)
    axes.axvline(0, color="lightgray", linewidth=0.8)
    axes.set(
        xlim=(low, high),
        ylim=(low, high),
        xlabel="SAGE's logged change",
        ylabel="predicted change",
        title=title or f"{len(records)} turns",
    )
    figure.savefig(path)


@dataclass
class ReplayResult:
    """What :func:`replay_logs` returns.

    Attributes:
        report: :func:`summarize_replay`'s dict plus ``config``.
        records: the per-turn records, in log, dialogue and turn order.
        logs: the logs read.
        out_dir: where the files went, or ``None``.
        resumed: turns taken from an existing ``turns.jsonl``.
    """

    report: dict[str, Any]
    records: list[dict[str, Any]]
    logs: list[LogFile] = field(default_factory=list)
    out_dir: Path | None = None
    resumed: int = 0


def replay_logs(
    logs: Sequence[str | os.PathLike],
    user: str | Mapping[str, Any] | UserSpec | SimulatedUser = "rule",
    *,
    difficulty: Any = "moderate",
    protocol: Any = "sage",
    seed: int = 0,
    batch_size: int = 64,
    limit: int | None = None,
    personas: Any = None,
    out_dir: str | os.PathLike | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Re-appraise every scored turn of the logs with ``user`` and compare with the logged changes.

    Args:
        logs: SAGE's ``*_result.jsonl`` files, our own ``transcripts.jsonl`` (eval) or
            ``episodes.jsonl`` (training), or folders of them (:func:`read_logs`).
        user: as :attr:`~empathy_gym.evaluation.benchmark.EvalConfig.user` (a spec is
            built here and closed at the end; a ready :class:`SimulatedUser` is not closed).
        difficulty: preset name, path or dict (LLM users' instructions, rule weights).
        protocol: clamps the predicted change (``"sage"``: [-10, 10]) and is the protocol
            checked against the logs.
        seed: each turn's request seed is ``derive_seed(seed, log name, dialogue id, turn)``.
        batch_size: turns per appraise call (>= 1); results are saved after each batch.
        limit: the first ``limit`` dialogues of each log (>= 1).
        personas: the persona bank our own logs were played with (:func:`read_logs`).
        out_dir: where to write ``run.json``, ``turns.jsonl``, ``report.json`` and
            ``scatter.png``, and to resume from (``None``: nothing written).
        on_progress: ``on_progress(done, total)`` in turns, once before the first batch
            and after each.

    Returns:
        :class:`ReplayResult`.

    Raises:
        SageLogError, FileNotFoundError: as :func:`read_logs`.
        EvaluationError: logs without an appraised turn, a run directory with another
            configuration, an ``out_dir`` that is a file, a corrupt ``turns.jsonl``, bad
            ``batch_size`` / ``limit``.
        SpecError, TypeError: a bad user spec.
        SimulatorError, BackendError: from the user; turns already appraised stay in ``turns.jsonl``.
    """
    from empathy_gym.evaluation.benchmark import describe_user
    from empathy_gym.user import resolve_protocol
    from empathy_gym.user.difficulty import load_difficulty

    if batch_size < 1:
        raise EvaluationError(f"batch_size must be >= 1, got {batch_size}")
    if limit is not None and limit < 1:
        raise EvaluationError(f"limit must be >= 1, got {limit}")
    protocol_obj = resolve_protocol(protocol)
    difficulty_obj = load_difficulty(difficulty)
    files = read_logs(logs, limit=limit, personas=personas)
    user_name, appraisal_mode = describe_user(user)
    config = {
        "user": user_name,
        "appraisal_mode": appraisal_mode,
        "difficulty": difficulty_obj.name,
        "protocol": dataclasses.asdict(protocol_obj),
        "seed": seed,
    }
    todo = _scored_turns(files, seed)
    if not todo:
        raise EvaluationError(
            f"nothing to replay: no appraised turn in {', '.join(str(log.path) for log in files)} "
            f"({sum(len(log.dialogues) for log in files)} dialogues); replay reads dialogues whose turns carry "
            "the user's emotion change (SAGE's *_result.jsonl, eval's transcripts.jsonl, training's episodes.jsonl)"
        )
    folder = RunFolder(out_dir, config, TURNS, TURN_KEY) if out_dir is not None else None
    keys = [(log.name, dialogue.id, turn.turn) for log, dialogue, turn, _ in todo]
    done = folder.done if folder is not None else {}
    pending = [item for item, key in zip(todo, keys) if key not in done]
    if on_progress is not None:
        on_progress(len(todo) - len(pending), len(todo))
    if pending:
        shared_user = (
            user if isinstance(user, SimulatedUser) else as_user_spec(user).build(difficulty_obj, protocol_obj)
        )
        try:
            if folder is not None:
                folder.start()
            _appraise_pending(
                shared_user,
                pending,
                protocol_obj,
                batch_size,
                folder,
                done,
                lambda: on_progress(len(done), len(todo)) if on_progress is not None else None,
            )
        finally:
            if folder is not None:
                folder.close()
            if shared_user is not user:
                shared_user.close()
    records = [done[key] for key in keys]
    checks = {log.name: [replay_with_logged_changes(d, protocol_obj) for d in log.dialogues] for log in files}
    report = summarize_replay(files, records, checks)
    report["config"] = {**config, "logs": [log.path for log in files], "limit": limit}
    if folder is not None:
        _write_report(folder, report, records)
    return ReplayResult(report, records, files, folder.path if folder is not None else None, len(todo) - len(pending))


def _write_report(folder: RunFolder, report: dict[str, Any], records: Sequence[Mapping[str, Any]]) -> None:
    folder.write_report(report)
    overall = report["agreement"]
    plot_agreement(
        records,
        folder.path / PLOT,
        title=(
            f"{report['config']['user']} vs the logged appraisals ({len(records)} turns)\n"
            f"sign agreement {overall['sign_agreement']:.2f}, Spearman {overall['spearman']:.2f}"
        ),
    )


_Pending = tuple[LogFile, LoggedDialogue, LoggedTurn, UserRequest]


def _scored_turns(files: Sequence[LogFile], seed: int) -> list[_Pending]:
    """Every scored turn of ``files``, in log, dialogue and turn order, with its seeded request."""
    return [
        (
            log,
            dialogue,
            turn,
            turn_request(turn, dialogue.persona, seed=derive_seed(seed, log.name, dialogue.id, turn.turn)),
        )
        for log in files
        for dialogue in log.dialogues
        for turn in dialogue.turns
        if turn.scored
    ]


def _appraise_pending(
    user: SimulatedUser,
    pending: Sequence[_Pending],
    protocol: EmotionProtocol,
    batch_size: int,
    folder: RunFolder | None,
    done: dict[tuple[Any, ...], dict[str, Any]],
    progress: Callable[[], None],
) -> None:
    """Appraise ``pending`` in batches; each batch's records go to ``done`` (and the folder)."""
    batches = _appraise_in_batches(user, [item[3] for item in pending], batch_size)
    for start, appraisals in zip(range(0, len(pending), batch_size), batches):
        batch = pending[start : start + len(appraisals)]
        records = [
            turn_record(log, dialogue, turn, request, appraisal, protocol)
            for (log, dialogue, turn, request), appraisal in zip(batch, appraisals)
        ]
        if folder is not None:  # adds them to folder.done, which is done
            folder.append(
                records,
                where=[f"{log.name} dialogue {dialogue.id!r} turn {turn.turn}" for log, dialogue, turn, _ in batch],
            )
        else:
            done.update({(r["log"], r["dialogue_id"], r["turn"]): r for r in records})
        progress()
