"""A run folder: where a resumable run keeps what it must not lose, and the one place that
says what a folder holds (:data:`RUN_MARKS`, :func:`held_runs`). One folder holds one run:
training, ``empathy-gym eval``, ``replay``, ``distill`` and ``capabilities --out`` each
refuse a folder holding another kind of run or inside one (:func:`check_holds_no_other`),
and an eval or replay refuses a folder another one is running in (:data:`LOCK`).

How a rerun continues is each command's own, on purpose: training continues only with
``--resume`` (:func:`check_fresh`; as ``resume_from_checkpoint`` in Transformers'
``Trainer``), because a resumed run may change ``total_steps`` or the learning rate; eval,
replay and distill continue by themselves, because a finished record depends on nothing
but the configuration in ``run.json``, which a rerun must match.

For eval and replay (:class:`RunFolder`), ``run.json`` holds the run's configuration,
checked on resume (a folder holding another configuration is refused, unless it holds no
finished record: then the new run replaces it); a JSON Lines file holds the finished
records, appended and fsynced as they finish (a last line cut by a crash is ignored and
repaired on resume); ``report.json`` is written atomically at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from empathy_gym.evaluation.jsonl import json_object, lines

RUN_CONFIG = "run.json"
REPORT = "report.json"
TRANSCRIPTS = "transcripts.jsonl"
TURNS = "turns.jsonl"
FEATURES = "features"
#: The file a run's folder is locked with (fcntl): while an eval or a replay runs there, or a
#: study's child trains there, or the study prepares it.
LOCK = ".lock"

#: What each kind of run leaves in its folder, made when it starts (eval's and replay's
#: records file, distill's features/) or with its first output (training's): a folder holding
#: one of them holds that kind of run.
RUN_MARKS: dict[str, tuple[str, ...]] = {
    "training": ("checkpoints", "metrics.jsonl", "heldout"),
    "eval": (TRANSCRIPTS,),
    "replay": (TURNS,),
    "distill": (FEATURES,),
}
#: The folders inside a run's folder that belong to it: no other run may use one as its own.
RUN_PARTS: dict[str, tuple[str, ...]] = {
    "training": ("checkpoints", "heldout", "transcripts", "tb"),
    "distill": (FEATURES,),
}


class EvaluationError(ValueError):
    """Invalid input to an evaluation run (``eval``, ``replay``): a corrupt records file
    or ``run.json`` (the message names the file and line), a folder holding another
    configuration, another kind of run or a run still running, or a file in its place, a
    record that cannot be written, or bad options."""


def read_jsonl_records(
    path: str | os.PathLike, key_fields: Sequence[str], *, repair: bool = False
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The records of an append-only JSON Lines file, by key (the values of ``key_fields``;
    the first record of a key wins).

    A last line without its newline is an unfinished write: it is ignored, and with
    ``repair=True`` cut off the file so that appends start on a fresh line.

    Returns:
        ``{key: record}``; empty when the file does not exist.

    Raises:
        EvaluationError: a complete line that is not a JSON object or lacks a key field,
            naming the file and the line.
    """
    path = Path(path)
    if not path.exists():
        return {}
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1
    if repair and complete < len(data):
        with open(path, "r+b") as handle:
            handle.truncate(complete)
            handle.flush()
            os.fsync(handle.fileno())
    records: dict[tuple[Any, ...], dict[str, Any]] = {}
    for number, line in enumerate(lines(data[:complete].decode("utf-8")), start=1):
        if not line.strip():
            continue
        record = json_object(line, path, number, EvaluationError)
        for name in key_fields:
            if name not in record:
                raise EvaluationError(f"{path}:{number}: field {name!r}: missing")
        records.setdefault(tuple(record[name] for name in key_fields), record)
    return records


def append_records(
    path: str | os.PathLike, records: Sequence[Mapping[str, Any]], *, where: Sequence[str] | None = None
) -> None:
    """Append records as JSON lines (UTF-8), fsynced. Every line is encoded before the file
    is opened, so records that cannot be written leave the file unchanged.

    Args:
        where: one description per record (e.g. the dialogue), for the error message.

    Raises:
        EvaluationError: a record holds text that UTF-8 cannot encode (a lone
            surrogate), naming the record (``where``) and the offending text.
    """
    lines = []
    for index, record in enumerate(records):
        try:
            lines.append((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        except UnicodeEncodeError as error:
            snippet = error.object[max(0, error.start - 30) : error.end + 30]
            what = where[index] if where is not None else f"record {index + 1}"
            raise EvaluationError(f"{path}: cannot write {what}: {error.reason} near {snippet!r}") from None
    with open(path, "ab") as handle:
        handle.write(b"".join(lines))
        handle.flush()
        os.fsync(handle.fileno())


def write_json(path: Path, payload: Any) -> None:
    """Write JSON atomically (a temporary file renamed over ``path``)."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(payload, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def held_runs(folder: str | os.PathLike) -> dict[str, list[str]]:
    """The kinds of run whose marks (:data:`RUN_MARKS`) ``folder`` holds, each with the
    marks found; empty for a new or empty folder."""
    folder = Path(folder)
    found = {kind: [name for name in marks if (folder / name).exists()] for kind, marks in RUN_MARKS.items()}
    return {kind: names for kind, names in found.items() if names}


def check_holds_no_other(
    folder: str | os.PathLike, kind: str, marks: Sequence[str] = (), error: type[Exception] = EvaluationError
) -> None:
    """Refuse a folder that holds another kind of run than ``kind`` (a key of
    :data:`RUN_MARKS`, or any name whose own ``marks`` are given), or that is part of
    another run's folder (:data:`RUN_PARTS`: ``RUN/heldout``; ``RUN/eval`` is a folder of its own).

    Raises:
        ``error`` (:class:`EvaluationError` unless given): naming the folder, the run it
            holds or is part of, and the files that say so.
    """
    folder = Path(folder)
    for part in (folder, *folder.parents[:-1]):  # RUN/heldout, RUN/heldout/x, ...
        for other in held_runs(part.parent):
            if part.name in RUN_PARTS.get(other, ()):
                raise error(f"{folder} is part of the {other} run in {part.parent}; give a folder of its own")
    own = {*RUN_MARKS.get(kind, ()), *marks}
    for other, names in held_runs(folder).items():
        if other != kind and not own.intersection(names):
            raise error(
                f"{folder} holds another kind of run: {other} ({', '.join(names)}); one folder holds one run: "
                "give another folder"
            )


def holds_a_run(output_dir: str | os.PathLike) -> bool:
    """A training run has written something in ``output_dir`` that ``--resume`` continues
    from (a checkpoint, metrics, or the held-out evaluation's files)."""
    return "training" in held_runs(output_dir)


def check_fresh(output_dir: str | os.PathLike) -> None:
    """Check that a training run may start (not resume) in ``output_dir``.

    Raises:
        FileExistsError: the folder holds a previous training run's metrics, or another
            kind of run (:func:`check_holds_no_other`).
    """
    metrics = Path(output_dir) / "metrics.jsonl"
    if metrics.exists() and metrics.stat().st_size:
        raise FileExistsError(
            f"{output_dir} already holds a run (metrics.jsonl); pass --resume to continue it "
            "or choose another output_dir"
        )
    check_holds_no_other(output_dir, "training", error=FileExistsError)


def _hold_lock(folder: Path) -> IO[str] | None:
    """``folder``'s lock (:data:`LOCK`), held until the returned file closes (at the latest
    when the process ends); ``None`` where another process holds it."""
    import fcntl

    handle = open(folder / LOCK, "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[bool]:
    """Hold ``folder``'s lock (:data:`LOCK`, created with the folder) inside the block;
    yields ``False`` where another process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = _hold_lock(folder)
    try:
        yield handle is not None
    finally:
        if handle is not None:
            handle.close()


def changed_fields(out_dir: Path, config: Mapping[str, Any]) -> list[str]:
    """The fields in which a run directory's ``run.json`` differs from ``config``, each as
    ``"field: old -> new"``; empty when they agree or there is no ``run.json``.

    Raises:
        EvaluationError: a ``run.json`` that is not valid JSON, naming the file and line.
    """
    path = out_dir / RUN_CONFIG
    if not path.exists():
        return []
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise EvaluationError(f"{path}:{error.lineno}: not valid JSON: {error.msg}") from None
    return differences(old, json.loads(json.dumps(dict(config))))


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The keys whose values differ, each as ``"key: old -> new"`` (sorted by key)."""
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def check_run_config(out_dir: Path, config: Mapping[str, Any]) -> None:
    """Check that a run directory's ``run.json``, when there is one, holds ``config``.

    Raises:
        EvaluationError: naming each field that differs (old and new value), or a
            ``run.json`` that is not valid JSON.
    """
    changed = changed_fields(out_dir, config)
    if changed:
        raise EvaluationError(
            f"{out_dir / RUN_CONFIG}: this directory holds a run with another configuration "
            f"({'; '.join(changed)}); use another --out directory, or delete "
            f"it to start over"
        )


class RunFolder:
    """A run's folder, opened for a run with ``config``.

    Args:
        path: the folder (created by :meth:`start`; may exist and hold this run).
        config: the run's configuration (JSON-serialisable); compared with ``run.json``.
        records: the records file's name, e.g. ``"transcripts.jsonl"``.
        key_fields: the record fields that identify a record (its key in :attr:`done`).

    Attributes:
        kind: the kind of run (a key of :data:`RUN_MARKS` whose marks name ``records``, or
            ``records`` itself).
        done: the finished records by key, read from the records file and added to by
            :meth:`append`.

    Raises:
        EvaluationError: ``path`` is a file, holds another kind of run
            (:func:`check_holds_no_other`), ``run.json`` holds another configuration or
            is not JSON while records are saved, or the records file is corrupt (file and line).
    """

    def __init__(self, path: str | os.PathLike, config: Mapping[str, Any], records: str, key_fields: Sequence[str]):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise EvaluationError(f"out_dir {str(self.path)!r} is a file; give a folder (new, or a run to resume)")
        self.kind = next((kind for kind, marks in RUN_MARKS.items() if records in marks), records)
        check_holds_no_other(self.path, self.kind, marks=[records])
        self.config = dict(config)
        self.records = self.path / records
        self.key_fields = tuple(key_fields)
        self._lock: IO[str] | None = None  # held from start() on
        self.done: dict[tuple[Any, ...], dict[str, Any]] = read_jsonl_records(
            self.records, self.key_fields, repair=True
        )
        if self.done:  # a run that finished nothing (it failed at its first call) is replaced
            check_run_config(self.path, self.config)

    def key(self, record: Mapping[str, Any]) -> tuple[Any, ...]:
        """The record's key: the values of ``key_fields``."""
        return tuple(record[name] for name in self.key_fields)

    def start(self) -> None:
        """Create the folder, write ``run.json`` (a resumed run keeps its own) and the
        records file (empty): from now on the folder holds this kind of run, also for a
        command started while this one has finished nothing yet.

        Raises:
            EvaluationError: the folder cannot be created or written, naming ``out_dir``;
                another kind of run took the folder since this one was opened.
        """
        check_holds_no_other(self.path, self.kind, marks=[self.records.name])
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock = _hold_lock(self.path)
        except OSError as error:
            raise EvaluationError(f"out_dir {str(self.path)!r}: cannot write there ({error})") from None
        if self._lock is None:
            raise EvaluationError(
                f"out_dir {str(self.path)!r}: another run is running there ({LOCK} is held); "
                "wait for it to end, or give another folder"
            )
        try:
            if not self.done or not (self.path / RUN_CONFIG).exists():
                write_json(self.path / RUN_CONFIG, self.config)
            self.records.touch()
        except OSError as error:
            raise EvaluationError(f"out_dir {str(self.path)!r}: cannot write there ({error})") from None

    def close(self) -> None:
        """Release the folder's lock (taken by :meth:`start`): the run has ended, finished
        or not, and a rerun may resume it."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def append(self, records: Sequence[Mapping[str, Any]], where: Sequence[str]) -> None:
        """Append finished records (:func:`append_records`; ``where`` names each in errors)."""
        append_records(self.records, records, where=where)
        for record in records:
            self.done[self.key(record)] = dict(record)

    def write_report(self, report: Mapping[str, Any]) -> Path:
        """Write ``report.json`` atomically; returns its path."""
        write_json(self.path / REPORT, report)
        return self.path / REPORT
