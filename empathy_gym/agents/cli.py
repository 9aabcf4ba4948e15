"""The command line of ``examples/train_ppo.py`` and ``examples/train_grpo.py``; its exit
codes are in docs/training.md. Output to a console that has gone away (``... | tee log``,
then Ctrl-C) is dropped; the log is also in ``<output_dir>/train.log``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from empathy_gym.agents.config import RecipeError, load_recipe
from empathy_gym.agents.console import ConsoleStream, honour_interrupts, point_at_devnull, tolerant_console
from empathy_gym.resources import recipes_dir


def parse_args(algorithm: str, argv: list[str] | None = None) -> argparse.Namespace:
    shipped = sorted(path.stem for path in recipes_dir().glob("*.yaml"))
    parser = argparse.ArgumentParser(
        prog=f"train_{algorithm}.py",
        description=f"Train an LLM policy with {algorithm.upper()} against the simulated user.",
        epilog="Overrides: any recipe field as key=value, e.g. total_steps=10 policy.lora_r=8 "
        "env.kwargs.max_turns=4 generation.max_new_tokens=64."
        f" Shipped recipes (by name or as agents/NAME.yaml): {', '.join(shipped)}.",
    )
    parser.add_argument(
        "--recipe",
        required=True,
        help="a YAML recipe file, or a shipped recipe's name: e.g. smollm2-cpu-grpo (the "
        "README's quick start) or tiny-cpu (a tiny random model, for smoke runs)",
    )
    parser.add_argument("--resume", action="store_true", help="continue from output_dir/checkpoints/latest")
    parser.add_argument("--output-dir", help="shortcut for output_dir=...")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    return parser.parse_intermixed_args(argv)  # options between overrides too: `x=1 --resume y=2`


def say(*lines: str, file: object = None) -> None:
    """Print to the console if it is still there (``file``: stdout by default); a dead
    stream is pointed at /dev/null (:func:`~empathy_gym.agents.console.settle`'s why)."""
    stream = file or sys.stdout
    for line in lines:
        print(line, file=stream)
    stream.flush()
    if isinstance(stream, ConsoleStream) and stream.broken:
        point_at_devnull(stream)


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


def train_main(
    algorithm: str, argv: list[str] | None = None, *, trainer_class: Any = None, command: str | None = None
) -> int:
    """Run a training job; returns the exit code. Output to a console that has gone
    away is dropped (:mod:`~empathy_gym.agents.console`). ``trainer_class`` replaces
    the algorithm's trainer (e.g. a control from :mod:`~empathy_gym.agents.controls`);
    ``command`` is what the closing "Continue:" line runs to resume this same training
    (default ``python examples/train_ALGORITHM.py``), so that a control is continued
    as a control."""
    honour_interrupts()
    with tolerant_console():
        return _train_main(algorithm, argv, trainer_class, command)


def _train_main(
    algorithm: str, argv: list[str] | None = None, trainer_class: Any = None, command: str | None = None
) -> int:
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
    # refused before any model loads: a file; another kind of run's folder; --resume with no
    # run or another algorithm's or model's checkpoint; a fresh run in a previous run's folder
    from empathy_gym.evaluation.run_folder import check_fresh, check_holds_no_other, holds_a_run

    if Path(config.output_dir).exists() and not Path(config.output_dir).is_dir():
        say(
            f"error: output_dir {config.output_dir!r} is a file; give a folder (new, or a run to resume)",
            file=sys.stderr,
        )
        return 1
    if args.resume:
        try:
            check_holds_no_other(config.output_dir, "training", error=FileExistsError)
        except FileExistsError as error:
            say(f"error: --resume: {error}", file=sys.stderr)
            return 1
        if not holds_a_run(config.output_dir):
            say(
                f"error: --resume: {config.output_dir} holds no run to continue (no checkpoints/, metrics.jsonl or "
                f"heldout/); run without --resume to start one there, or give the run's output_dir=",
                file=sys.stderr,
            )
            return 1
        from empathy_gym.agents.checkpoint import CheckpointError, check_resume
        from empathy_gym.agents.config import to_dict

        try:
            check_resume(Path(config.output_dir) / "checkpoints", algorithm, to_dict(config))
        except CheckpointError as error:
            say(f"error: --resume: {error}", file=sys.stderr)
            return 1
    else:
        try:
            check_fresh(config.output_dir)
        except FileExistsError as error:
            say(f"error: {error}", file=sys.stderr)
            return 1
    with _log_to_file(config.output_dir):
        return _train(algorithm, config, args.resume, args.recipe, trainer_class, overrides, command)


def quiet_known_noise() -> None:
    """Silence library output that every run printed and that says nothing about it:
    transformers' "Loading weights" and "Writing model shards" progress bars (each
    checkpoint drew one) and the ``is_gradient_checkpointing`` FutureWarning that peft
    5's ``get_peft_model`` triggers in transformers 5. Other warnings stay."""
    import warnings

    warnings.filterwarnings("ignore", message=r".*`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


def number(value: float) -> str:
    """A metric for the console: 4 decimals, or 3 significant digits in scientific
    notation when that would print a small non-zero value as 0.0000 (an approx KL of
    1e-6 is not 0)."""
    if value != 0 and abs(value) < 5e-4:
        return f"{value:.2e}"
    return f"{value:.4f}"


def where_everything_is(
    config: Any,
    algorithm: str,
    recipe: str | None,
    evaluated: bool,
    overrides: list[str] | None = None,
    command: str | None = None,
) -> list[str]:
    """The closing lines: each output's path and how to continue the run: ``command``
    (default ``python examples/train_ALGORITHM.py``) with the run's ``overrides``,
    ``total_steps`` doubled."""
    from empathy_gym.agents.checkpoint import latest_checkpoint

    out = Path(config.output_dir)
    checkpoint = latest_checkpoint(out / "checkpoints")
    latest = (checkpoint or out / "checkpoints" / "step-N") / "policy"
    lines = [
        f"Outputs in {out}/:",
        "  curves.png          return and final emotion per step",
        f"  metrics.jsonl       one line of metrics per step (tensorboard --logdir {out / 'tb'})"
        if config.report_to == "tensorboard"
        else "  metrics.jsonl       one line of metrics per step",
        "  episodes.jsonl      every training dialogue; transcripts/ a few per step, readable",
        f"  checkpoints/        {checkpoint.name if checkpoint else 'none yet'}: the trained policy "
        f"(policy/{', a LoRA adapter' if config.policy.use_lora else ''}) and optimiser state; "
        "the file 'latest' names the newest",
    ]
    if evaluated:
        lines.append(
            "  heldout/            report.txt (the table above), report.json, before.jsonl and after.jsonl "
            "(every held-out dialogue; *_judge.jsonl: the second judge's, with heldout.user)"
        )
    policy_spec = f"hf:{config.policy.model},adapter={latest}" if config.policy.use_lora else f"hf:{latest}"
    command = command or f"python examples/train_{algorithm}.py"
    recipe_words = ["--recipe", recipe or "RECIPE"]
    more = config.total_steps * 2
    kept = [o for o in (overrides or []) if not o.startswith("total_steps=")]
    if not any(o.startswith("output_dir=") for o in kept):
        kept.append(f"output_dir={config.output_dir}")
    lines += [
        "Continue:",
        f"  {command} {shlex.join([*recipe_words, '--resume', *kept, f'total_steps={more}'])}   "
        f"(train {config.total_steps} more step{'s' if config.total_steps != 1 else ''})",
        f"  empathy-gym eval --policy {policy_spec} --personas en --max-tokens 64 --out {out / 'eval'}   "
        "(SAGE's protocol, 9 turns; replies capped at 64 tokens, which a CPU needs; --user for an LLM user; "
        f"{eval_time_bound(out / 'metrics.jsonl', EVAL_MAX_TOKENS)}; "
        "its progress bar estimates the time left after two rounds of turns)",
        f"  empathy-gym capabilities --model {config.policy.model} --adapter {latest} --limit 50   "
        "(math and code before and after training, by lm-eval; pip install 'empathy-gym[capabilities]')",
    ]
    return lines


#: The suggested evaluation's reply cap (``--max-tokens``).
EVAL_MAX_TOKENS = 64


def eval_time_bound(metrics: Path, max_tokens: int, bank: str = "en") -> str:
    """The suggested evaluation's time at most, from this run's own generation rate: every
    dialogue of ``bank`` running SAGE's 9 turns, each reply ``max_tokens`` (>= 1) long, at
    the median ``tokens/generated_per_second`` of the last 10 steps in ``metrics`` (the run's
    ``metrics.jsonl``; lines that are not a JSON object with a finite rate > 0 are skipped).
    Dialogues that end early, and the evaluation's larger batch, make it shorter
    (benchmarks/results/eval_time.txt compares). Returns a phrase for the closing lines;
    "no estimate" when ``metrics`` cannot be read or holds no rate. Never raises."""
    import json
    import math
    import statistics

    from empathy_gym.personas import load_personas
    from empathy_gym.user import resolve_protocol

    try:
        lines = Path(metrics).read_text(encoding="utf-8-sig", errors="replace").splitlines()
    except OSError:
        lines = []
    rates = []
    for line in lines:
        with contextlib.suppress(ValueError, OverflowError):  # OverflowError: an int too large for a float
            record = json.loads(line)
            rate = record.get("tokens/generated_per_second") if isinstance(record, dict) else None
            if isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) and rate > 0:
                rates.append(float(rate))
    if not rates:
        return "no estimate of its time (no generation rate in this run's metrics)"
    rate = statistics.median(rates[-10:])
    minutes = len(load_personas(bank)) * resolve_protocol("sage").max_turns * max_tokens / rate / 60
    said = "under a minute" if minutes < 1 else f"about {minutes:.0f} minute{'s' if round(minutes) != 1 else ''}"
    shown = f"{rate:.0f}" if rate >= 1 else f"{rate:.2g}"
    return f"at most {said} at this run's {shown} generated tokens/s"


def where_it_stopped(trainer: Any) -> str:
    """Where a stopped trainer was, for "stopped ..." and "aborted ...": at its step, or
    before the first (in the callbacks' ``on_train_begin``, such as the held-out evaluation,
    or while a resumed run's checkpoint loads: its step is not the run's yet) or after the
    last (the evaluation after training)."""
    if trainer.phase == "before":
        return "before training"
    if trainer.phase == "after":
        return f"after the last step ({trainer.step}), in the evaluation after training"
    return f"at step {trainer.step}"


def what_is_kept(output_dir: str) -> str:
    """What a stopped run left in ``output_dir`` (finished dialogues, the last
    checkpoint), and how to go on: the end of the message that says it stopped."""
    from empathy_gym.agents.checkpoint import latest_checkpoint

    episodes = Path(output_dir) / "episodes.jsonl"
    checkpoint = latest_checkpoint(Path(output_dir) / "checkpoints")
    return "; ".join(
        (
            f"finished dialogues are in {episodes}"
            if episodes.is_file() and episodes.stat().st_size
            else "no training dialogue had finished yet",
            f"the last checkpoint is {checkpoint}" if checkpoint else "no checkpoint yet",
            "rerun with --resume to continue" + (" from it" if checkpoint else ""),
        )
    )


def _train(
    algorithm: str,
    config: Any,
    resume: bool,
    recipe: str | None = None,
    trainer_class: Any = None,
    overrides: list[str] | None = None,
    command: str | None = None,
) -> int:
    quiet_known_noise()
    from empathy_gym.backends.base import BackendError
    from empathy_gym.user.base import SimulatorError

    try:  # the error classes below are bound before the clause that names them is evaluated
        from empathy_gym.agents import TRAINERS  # heavy: torch, transformers (seconds)
        from empathy_gym.agents.checkpoint import CheckpointError
        from empathy_gym.agents.memory import MemoryPlanError
    except KeyboardInterrupt:
        say("\nstopped before the first step; nothing to save", file=sys.stderr)
        return 130
    except (ImportError, OSError) as error:  # a broken torch or transformers install
        say(f"error: {error}", file=sys.stderr)
        return 1
    try:
        if trainer_class is not None:
            logging.getLogger(__name__).info("trainer: %s (in place of %s's)", trainer_class.__name__, algorithm)
        trainer = (trainer_class or TRAINERS[algorithm])(config)
    except KeyboardInterrupt:
        say("\nstopped before the first step; nothing to save", file=sys.stderr)
        return 130
    except (RecipeError, OSError, ImportError, ValueError, MemoryPlanError, BackendError) as error:  # a bad env
        say(f"error: {error}", file=sys.stderr)  # value, a model that is not there, vllm missing, too big
        return 1
    try:
        metrics = trainer.train(resume=resume)  # with heldout.bank: the evaluations before and after
    except (FileExistsError, CheckpointError) as error:
        say(f"error: {error}", file=sys.stderr)
        return 1
    except (BackendError, SimulatorError) as error:  # the user's server is gone, or its answers unusable
        say(f"error: {error}\nstopped {where_it_stopped(trainer)}; {what_is_kept(config.output_dir)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the second Ctrl-C: abort at once, keep the last checkpoint
        if trainer.phase == "after":
            say("\nstopped during the held-out evaluation; rerun with --resume to evaluate again", file=sys.stderr)
        else:
            logging.getLogger(__name__).warning(
                "aborted %s; %s", where_it_stopped(trainer), what_is_kept(config.output_dir)
            )
        return 130
    finally:
        trainer.close()  # the simulated users it built (a server's connections, a model's memory)
    if metrics:
        first, last = metrics[0], metrics[-1]
        rows = [
            f"{key:24}{number(first[key]):>12}{number(last[key]):>12}"
            for key in ("reward/mean_return", "emotion/final_mean", "episode/success_rate", "policy/approx_kl")
            if isinstance(first.get(key), float) and isinstance(last.get(key), float)
        ]
        say(
            f"\n{algorithm.upper()}: {trainer.step}/{config.total_steps} steps in {config.output_dir}",
            f"{'':24}{'first step':>12}{'last step':>12}",
            *rows,
        )
    if trainer.step < config.total_steps:
        logging.getLogger(__name__).warning("stopped at step %d; continue with --resume", trainer.step)
        return 130
    if trainer.heldout_report is not None:
        say("", trainer.heldout_report["text"])
    say("", *where_everything_is(config, algorithm, recipe, trainer.heldout_report is not None, overrides, command))
    return 0
