"""What a training run leaves on disk, written as it happens (docs/training.md, "Output,
interruption and resume").

``metrics.jsonl`` is strict JSON: a statistic undefined in a step (NaN) is written
``null``. On resume from step k, lines of later steps move from ``episodes.jsonl`` and
``metrics.jsonl`` to ``*.superseded.jsonl``, so each step appears once and nothing is lost.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from empathy_gym.agents.rollout import Trajectory
from empathy_gym.evaluation import jsonl
from empathy_gym.evaluation.run_folder import check_fresh
from empathy_gym.personas import Persona, load_personas, write_personas


def _keep_steps_upto(path: Path, step: int) -> None:
    """Move the lines of steps after ``step`` from ``path`` to ``<stem>.superseded.jsonl``
    (appended, synced to disk before ``path`` is replaced)."""
    if not path.exists():
        return
    kept, dropped = [], []
    for line in jsonl.lines(path.read_text(encoding="utf-8")):
        if not line:
            continue
        try:
            later = json.loads(line)["step"] > step
        except (json.JSONDecodeError, KeyError, TypeError):
            later = True  # a line cut by a crash
        (dropped if later else kept).append(line)
    if not dropped:
        return
    with open(path.with_name(path.stem + ".superseded.jsonl"), "a", encoding="utf-8") as superseded:
        superseded.write("".join(d + "\n" for d in dropped))
        superseded.flush()
        os.fsync(superseded.fileno())
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write("".join(k + "\n" for k in kept))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _json_value(value: Any) -> Any:
    """NaN and infinities as ``None`` (JSON has no NaN; ``json.dumps`` would write
    ``NaN``, which strict parsers reject)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


class RunLog:
    """Appends episodes and metrics; optional TensorBoard.

    Args:
        output_dir: the run folder (created).
        tensorboard: also write TensorBoard scalars under ``tb/``.
        resume_step: move JSONL lines of steps after this one aside (``None``: a fresh
            run, which raises ``FileExistsError`` in a folder that holds metrics or another
            kind of run: :func:`~empathy_gym.evaluation.run_folder.check_fresh`).
    """

    def __init__(self, output_dir: str | os.PathLike, *, tensorboard: bool = True, resume_step: int | None = None):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.episodes_path = self.dir / "episodes.jsonl"
        self.metrics_path = self.dir / "metrics.jsonl"
        if resume_step is None:
            check_fresh(self.dir)
        else:  # only lines of steps after the resumed one move aside
            _keep_steps_upto(self.episodes_path, resume_step)
            _keep_steps_upto(self.metrics_path, resume_step)
        self._episodes = open(self.episodes_path, "a", encoding="utf-8")
        self._metrics = open(self.metrics_path, "a", encoding="utf-8")
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(
                str(self.dir / "tb"), purge_step=resume_step + 1 if resume_step is not None else None
            )

    def record_personas(self, personas: Sequence[Persona]) -> None:
        """Write ``personas.jsonl``: ``personas`` after those a resumed run's file holds
        under other ids (a run resumed with another bank keeps both)."""
        path = self.dir / "personas.jsonl"
        ids = {persona.id for persona in personas}
        kept = [persona for persona in load_personas(path) if persona.id not in ids] if path.exists() else []
        write_personas([*kept, *personas], path.with_suffix(".tmp"))
        os.replace(path.with_suffix(".tmp"), path)

    def episode(self, step: int, trajectory: Trajectory) -> None:
        self.episode_record(step, trajectory.record())

    def episode_record(self, step: int, record: dict[str, Any]) -> None:
        """Append one finished episode (a :meth:`Trajectory.record`) and sync it to disk."""
        self._episodes.write(json.dumps(dict(step=step, **record), ensure_ascii=False) + "\n")
        self._episodes.flush()
        os.fsync(self._episodes.fileno())

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Append one step's metrics (NaN written as ``null``; TensorBoard skips them)."""
        record = {key: _json_value(value) for key, value in dict(step=step, **values).items()}
        self._metrics.write(json.dumps(record, allow_nan=False) + "\n")
        self._metrics.flush()
        if self._writer is not None:
            for key, value in values.items():
                if _json_value(value) is not None:
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()

    def transcripts(self, step: int, trajectories: list[Trajectory]) -> Path:
        folder = self.dir / "transcripts"
        folder.mkdir(exist_ok=True)
        path = folder / f"step-{step:06d}.txt"
        blocks = []
        for t in trajectories:
            lines = [
                f"# persona {t.persona_id} ({t.language}, {t.hidden_intention}, {t.character_type}); "
                f"return {t.episode_return:+.2f}; emotions {t.emotions}; ended: {t.termination}"
            ]
            turn = 0
            for message in t.messages[1:]:
                if message["role"] == "user":
                    lines.append(f"USER : {message['content']}")
                else:
                    lines.append(f"AGENT: {message['content']}    [reward {t.rewards[turn]:+.2f}]")
                    turn += 1
            blocks.append("\n".join(lines))
        path.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
        return path

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.exists():
            return []
        return [json.loads(line) for line in jsonl.lines(self.metrics_path.read_text()) if line.strip()]

    def plot(self) -> Path | None:
        """Draw ``curves.png`` (mean episode return and mean final emotion per step);
        ``None`` without metrics or without matplotlib."""
        rows = self.read_metrics()
        if not rows:
            return None
        try:
            import matplotlib
        except ImportError:
            return None
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        steps = [r["step"] for r in rows]
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
        left.plot(steps, [r["reward/mean_return"] for r in rows], marker="o")
        left.set(xlabel="step", ylabel="mean episode return", title="return (sum of emotion changes / 100)")
        right.plot(steps, [r["emotion/final_mean"] for r in rows], marker="o", color="tab:red")
        right.set(xlabel="step", ylabel="emotion", title="mean final emotion (0-100)")
        fig.tight_layout()
        path = self.dir / "curves.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    def close(self) -> None:
        self._episodes.close()
        self._metrics.close()
        if self._writer is not None:
            self._writer.close()
