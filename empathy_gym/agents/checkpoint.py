"""Checkpoints, written atomically: a temporary folder is synced to disk (``fsync``) and
only then renamed into place, as is the ``latest`` pointer, so a crash mid-save leaves the
previous checkpoint intact and a resume falls back to it (:func:`checkpoint_candidates`).

``<output_dir>/checkpoints/step-000010/``: ``policy/`` (the LoRA adapter or the full
model, with the tokenizer), ``modules.pt`` (value head or critic, optimizer and scheduler
states), ``rng.pt`` (Python, NumPy and torch RNG states), ``state.json`` (step, config).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from empathy_gym.seeding import rng_state

POINTER = "latest"


class CheckpointError(ValueError):
    """A checkpoint that cannot continue this run (another algorithm's or policy's)."""


def fsync_tree(path: Path) -> None:
    """``fsync`` every file under ``path`` and every folder (``path`` included), so that
    a rename that follows cannot reach the disk before the data it names."""
    for folder, _, files in os.walk(path):
        for name in files:
            fsync_path(Path(folder) / name)
        fsync_path(Path(folder))


def fsync_path(path: Path) -> None:
    """``fsync`` a file (its data) or a folder (its entries: names created, renamed or removed in it)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def save_checkpoint(
    root: Path, step: int, *, policy: Any, tokenizer: Any, modules: dict[str, Any], state: dict[str, Any], keep: int = 2
) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically; keep the newest ``keep``.

    Args:
        policy: a peft or transformers model (``save_pretrained``).
        modules: state dicts to ``torch.save`` (value head, optimizer, ...).
        state: JSON-serialisable run state (step, config, ...).

    Returns:
        The checkpoint folder.
    """
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    staging = root / f".tmp-step-{step:06d}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    policy.save_pretrained(staging / "policy")
    tokenizer.save_pretrained(staging / "policy")
    torch.save(modules, staging / "modules.pt")
    torch.save(rng_state(), staging / "rng.pt")
    (staging / "state.json").write_text(json.dumps(dict(state, step=step), indent=1))
    fsync_tree(staging)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    pointer = root / f".{POINTER}.tmp"
    pointer.write_text(final.name + "\n")
    fsync_path(pointer)
    os.replace(pointer, root / POINTER)
    fsync_path(root)
    for old in sorted(root.glob("step-*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    """The first of :func:`checkpoint_candidates`, or ``None``."""
    candidates = checkpoint_candidates(root)
    return candidates[0] if candidates else None


def checkpoint_candidates(root: Path) -> list[Path]:
    """The checkpoints to resume from, best first: the one the ``latest`` pointer names
    (when it exists), then every ``step-*`` folder with a ``state.json``, newest first;
    a resume tries them in order until one loads."""
    found = sorted((p for p in root.glob("step-*") if (p / "state.json").exists()), reverse=True)
    pointer = root / POINTER
    if pointer.exists():
        named = root / pointer.read_text().strip()
        if named in found:
            found.remove(named)
            found.insert(0, named)
    return found


#: Policy settings a resumed run shares with its checkpoint (LoRA's only with LoRA): its weights fit no other.
SAME_POLICY = ("model", "use_lora", "lora_r", "lora_target_modules")


def check_resumable(path: Path, state: dict[str, Any], algorithm: str, config: dict[str, Any]) -> None:
    """Refuse a checkpoint this run cannot continue: another algorithm's, one past the
    run's ``total_steps``, or another policy's (:data:`SAME_POLICY`). ``state``: the
    checkpoint's ``state.json``; ``config``: this run's (:func:`~empathy_gym.agents.config.to_dict`).

    Raises:
        CheckpointError: naming the checkpoint and each setting that differs.
    """
    if state.get("algorithm") != algorithm:
        raise CheckpointError(f"{path} is a {state.get('algorithm')} checkpoint, this is {algorithm}")
    if int(state.get("step", 0)) > config.get("total_steps", float("inf")):
        raise CheckpointError(f"{path} is at step {state['step']}, past total_steps={config['total_steps']}")
    saved, now = (state.get("config") or {}).get("policy") or {}, config.get("policy") or {}
    changed = [
        f"policy.{key}: {saved[key]!r} -> {now.get(key)!r}"
        for key in SAME_POLICY
        if key in saved and saved[key] != now.get(key) and (now.get("use_lora") or not key.startswith("lora_"))
    ]
    if changed:
        raise CheckpointError(
            f"{path} holds another policy's weights ({'; '.join(changed)}); resume with the recipe the run "
            f"was trained with, or give another output_dir="
        )


def check_resume(root: Path, algorithm: str, config: dict[str, Any]) -> None:
    """:func:`check_resumable` on the best checkpoint under ``root`` whose ``state.json``
    reads (none: nothing to check); only JSON is read, so it runs before any model loads.

    Raises:
        CheckpointError: as :func:`check_resumable`.
    """
    for candidate in checkpoint_candidates(root):
        try:
            state = json.loads((candidate / "state.json").read_text())
        except (OSError, ValueError):
            continue
        check_resumable(candidate, state, algorithm, config)
        return


def load_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(state, modules, rng)`` of a checkpoint folder (the policy weights are read by
    the trainer, which knows whether they are an adapter or a full model).

    Raises:
        OSError, ValueError, RuntimeError, EOFError, pickle.UnpicklingError: a missing
            or damaged file (``json`` and ``torch.load`` errors as they come).
    """
    state = json.loads((path / "state.json").read_text())
    modules = torch.load(path / "modules.pt", map_location="cpu", weights_only=False)
    rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=False)
    return state, modules, rng
