"""Checkpoints written atomically: everything goes into a temporary folder that is
renamed into place, and the ``latest`` pointer is replaced in one ``os.replace``. A
crash mid-save leaves the previous checkpoint intact.

Layout of ``<output_dir>/checkpoints/step-000010/``: ``policy/`` (the LoRA adapter, or
the full model, with the tokenizer; loadable with peft / transformers), ``modules.pt``
(value head or critic, optimizer and scheduler states), ``rng.pt`` (Python, NumPy and
torch RNG states), ``state.json`` (step, config).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

POINTER = "latest"


class CheckpointError(ValueError):
    """A checkpoint that cannot continue this run (another algorithm's)."""


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch (CPU, and CUDA when present) RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(root: Path, step: int, *, policy: Any, tokenizer: Any,
                    modules: dict[str, Any], state: dict[str, Any], keep: int = 2) -> Path:
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
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    pointer = root / f".{POINTER}.tmp"
    pointer.write_text(final.name + "\n")
    os.replace(pointer, root / POINTER)
    for old in sorted(root.glob("step-*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint the ``latest`` pointer names, or ``None`` when there is none."""
    pointer = root / POINTER
    if not pointer.exists():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / "state.json").exists() else None


def load_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(state, modules, rng)`` of a checkpoint folder (the policy weights are read by
    the trainer, which knows whether they are an adapter or a full model)."""
    state = json.loads((path / "state.json").read_text())
    modules = torch.load(path / "modules.pt", map_location="cpu", weights_only=False)
    rng = torch.load(path / "rng.pt", map_location="cpu", weights_only=False)
    return state, modules, rng
