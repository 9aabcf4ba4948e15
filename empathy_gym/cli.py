"""The ``empathy-gym`` command (typer): ``eval``, ``replay``, ``distill``, ``serve``, ``play``, ``personas``, ``envs``.

Exit codes: :data:`EXIT_CODES` (the table in docs/evaluation.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from empathy_gym.backends import chat_backends, spec_form
from empathy_gym.evaluation.policies import LOCAL_MAX_TOKENS, reply_token_cap
from empathy_gym.user.difficulty import builtin_difficulties

EXIT_CODES = (
    "Exit codes: 0 ok; 1 invalid input or a failed run (message on stderr); 2 usage error; "
    "130 interrupted (Ctrl-C or SIGTERM); "
    "141 the output's reader went away (| head), the work done and saved."
)
#: 128 + SIGPIPE, what a shell reports for a program killed by writing to a closed pipe
PIPE_CLOSED = 141

app = typer.Typer(
    name="empathy-gym",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    epilog=EXIT_CODES,
    rich_markup_mode="markdown",
    help="Simulated users for training and evaluating empathetic LLM agents (RLVER, SAGE).",
)
personas_app = typer.Typer(
    no_args_is_help=True, epilog=EXIT_CODES, rich_markup_mode="markdown", help="Validate, list and show persona banks."
)
app.add_typer(personas_app, name="personas")

# Piped (no terminal, no COLUMNS), Rich would cut the tables to 80 columns ("gemi…"):
# give them the width they need instead.
PIPED_WIDTH = 200
console = Console(
    highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPED_WIDTH
)
errors = Console(stderr=True, highlight=False, soft_wrap=True)

PERSONAS_HELP = (
    "persona bank: a name (sage: SAGE's 100 test profiles; rlver: the 500 RLVER "
    "training profiles; rlver_minus_sage: those without the 47 players that also "
    "occur in sage; en; zh; adversarial: users who try to break the agent) or a JSONL "
    "path, in our format or RLVER/SAGE's (first_talk is the opening line)"
)
MAX_TOKENS_HELP = (
    f"model policies: new tokens per reply; default: {LOCAL_MAX_TOKENS} for local "
    f"(hf:) policies, no cap for openai: ones (as SAGE); 0: no cap"
)
DIFFICULTY_HELP = " | ".join([*builtin_difficulties(), "a preset JSON path"])
USER_HELP = (
    "simulated user: rule (offline, deterministic) | distilled[:FOLDER] (a small distilled appraiser, "
    "offline) | "
    + " | ".join(map(spec_form, chat_backends()))
    + "; options as key=value after commas: appraisal_mode (free, choice), "
    "difficulty, temperature, max_concurrency, ..."
)


class ProtocolName(str, Enum):
    sage = "sage"
    rlver_training = "rlver_training"


@contextlib.contextmanager
def _exit_codes(interrupted: str = "interrupted", resume: Callable[[], str | None] | None = None) -> Iterator[None]:
    """Known errors to exit code 1 with their message, Ctrl-C to 130. What ``resume()`` says
    (if not ``None``) follows the error of a user or server that failed mid-run."""
    from empathy_gym.backends.base import BackendError
    from empathy_gym.evaluation.policies import PolicyOutputError
    from empathy_gym.user.base import SimulatorError

    known = (ValueError, KeyError, OSError, BackendError, SimulatorError, ImportError, PolicyOutputError)
    try:
        yield
    except KeyboardInterrupt:
        errors.print(f"\n{escape(interrupted)}")
        raise typer.Exit(130) from None
    except known as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        if resume and isinstance(error, (BackendError, SimulatorError)) and (kept := resume()):
            message = f"{message}\n{kept}"
        errors.print(f"[red]error:[/red] {escape(str(message))}")
        raise typer.Exit(1) from None


# -- eval ------------------------------------------------------------------------------
@app.command("eval", epilog=EXIT_CODES)
def eval_command(
    policy: Annotated[
        str,
        typer.Option(
            "--policy",
            "-p",
            help="the agent: baseline:NAME (generic, echo, listener, esconv) | hf:PATH with options "
            "after commas (adapter=DIR, device=cuda, dtype=bfloat16) | openai:MODEL@URL | "
            "python:MODULE:ATTR; model policies sample at temperature=0.7, top_p=1.0 unless the "
            "spec says otherwise",
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="run directory: report.json, transcripts.jsonl, trajectories.png; rerun to resume"
        ),
    ],
    personas: Annotated[str, typer.Option(help=PERSONAS_HELP)] = "sage",
    user: Annotated[str, typer.Option(help=USER_HELP)] = "rule",
    difficulty: Annotated[str, typer.Option(help=DIFFICULTY_HELP)] = "moderate",
    protocol: Annotated[
        ProtocolName,
        typer.Option(
            help="sage: start 40, change in [-10, 10], ends at 100, below 10 or on a goodbye, at most 10 "
            "agent replies of which the 10th is never scored (9 steps)"
        ),
    ] = ProtocolName.sage,
    think: Annotated[bool, typer.Option(help="the policy writes `<think>...</think>` before each reply")] = False,
    limit: Annotated[int | None, typer.Option(min=1, help="only the first N personas")] = None,
    repeats: Annotated[int, typer.Option(min=1, help="dialogues per persona, each with its own seed")] = 1,
    seed: Annotated[int, typer.Option(min=0, help="run seed (dialogue seeds, sampling, bootstrap)")] = 0,
    batch_size: Annotated[int, typer.Option(min=1, help="dialogues run at once")] = 32,
    max_tokens: Annotated[int | None, typer.Option(min=0, help=MAX_TOKENS_HELP)] = None,
) -> None:
    """Run the Sentient benchmark (SAGE): one dialogue per persona (default: SAGE's 100
    test profiles), the mean final emotion with a bootstrap 95% CI, success and failure
    counts, breakdowns by hidden intention and character type.

    Offline, a baseline against the rule user on 50 SAGE profiles:

        empathy-gym eval --policy baseline:listener --user rule --limit 50 --out runs/listener

    A local model (with a LoRA adapter) against an LLM user on an OpenAI-compatible server:

        empathy-gym eval --policy hf:Qwen/Qwen2.5-7B-Instruct,adapter=runs/ppo/checkpoints/step-000300/policy \\
            --user openai:Qwen/Qwen2.5-72B-Instruct@http://localhost:8000/v1 --out runs/ppo-eval

    Each finished dialogue is saved at once; rerunning the same command after a crash or
    Ctrl-C skips them and gives the same report.
    """
    from empathy_gym.evaluation.benchmark import TRANSCRIPTS, evaluate
    from empathy_gym.personas import load_personas

    with _exit_codes():
        console.print(escape(bank_language_line(personas, load_personas(personas))))
    if max_tokens is None and reply_token_cap(policy, None) is not None:
        console.print(
            f"replies: at most {LOCAL_MAX_TOKENS} new tokens (the default for local policies; "
            f"--max-tokens N to change, 0 for no cap)"
        )
    with _resumable("dialogues", f"finished dialogues (if any) are saved in {out / TRANSCRIPTS}", out) as bars:
        judging = _judging(user, difficulty, protocol, seed, batch_size, limit)
        result = evaluate(
            policy,
            personas,
            think=think,
            repeats=repeats,
            max_tokens=max_tokens,
            out_dir=out,
            on_progress=bars.on_progress,
            on_turns=bars.on_turns,
            **judging,
        )
    _print_report(result.report, result.resumed)
    console.print(f"wrote {out}/report.json, transcripts.jsonl, trajectories.png")


def _judging(
    user: str, difficulty: str, protocol: ProtocolName, seed: int, batch_size: int, limit: int | None
) -> dict[str, Any]:
    """The options ``eval`` and ``replay`` share: who judges, by which protocol, in what batches."""
    return dict(
        user=user, difficulty=difficulty, protocol=protocol.value, seed=seed, batch_size=batch_size, limit=limit
    )


class _Bars(NamedTuple):
    """What a resumable run reports its progress to: ``on_progress(done, total)`` for its
    units (dialogues, turns, shards) and ``on_turns(played, at_most)`` for the turns played
    inside its dialogues (a second bar, shown once called)."""

    on_progress: Callable[[int, int], None]
    on_turns: Callable[[int, int], None]


@contextlib.contextmanager
def _resumable(task: str, saved: str, folder: Path) -> Iterator[_Bars]:
    """A resumable run's progress bars and exit codes; Ctrl-C, and a failed user or server
    once ``folder`` exists, say what is ``saved``. The first ``on_progress`` call with
    ``done > 0`` (a resumed run) says how many were found done. The bars estimate the time
    left from the speed since their first step (rounds of a long run come minutes apart)."""
    resume = f"{saved}; rerun the same command to resume"
    first = True
    turns_bar = None

    def on_progress(done: int, total: int) -> None:
        nonlocal first
        if first and done:
            console.print(f"resuming: found {done} of {total} {task} done in {escape(str(folder))}")
        first = False
        progress.update(bar, completed=done, total=total)

    def on_turns(played: int, at_most: int) -> None:
        nonlocal turns_bar
        if turns_bar is None:
            turns_bar = progress.add_task("turns (at most)", total=at_most)
        progress.update(turns_bar, completed=played, total=at_most)

    with _exit_codes(f"interrupted: {resume}", lambda: resume if folder.exists() else None), _progress() as progress:
        bar = progress.add_task(task, total=None)
        yield _Bars(on_progress, on_turns)


def _progress() -> Progress:
    """The progress bar of a long command (on stderr, only on a terminal, gone when done)."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=errors,
        speed_estimate_period=24 * 3600,
        transient=True,
        disable=not errors.is_terminal,
    )


def language_counts(bank: Any) -> str:
    """The languages of a persona bank with their counts: ``"en 48, zh 8"``."""
    languages = Counter(p.language for p in bank)
    return ", ".join(f"{lang} {n}" for lang, n in sorted(languages.items()))


def bank_language_line(name: Any, bank: Any) -> str:
    """The persona bank and the language of its dialogues, in one line."""
    line = f"personas: {name} ({len(bank)} persona{'s' if len(bank) != 1 else ''}, {language_counts(bank)})"
    chinese = sum(p.language == "zh" for p in bank)
    if chinese == len(bank):
        return f"{line}: the dialogues are in Chinese; --personas en for English ones"
    if chinese:
        return f"{line}: some dialogues are in Chinese; --personas en for English ones only"
    return f"{line}: the dialogues are in English"


def must_not_line(summary: dict[str, Any]) -> str:
    """The must-not checks of a report in one line (``transcripts.jsonl`` names the turns)."""
    parts = ", ".join(f"{name} {c['violating']}/{c['checked']}" for name, c in summary["by_check"].items())
    return (
        f"must-not checks: {summary['violating']}/{summary['checked']} dialogues had a reply that did what "
        f"its persona's agent must not ({parts}; the turns: must_not in transcripts.jsonl)"
    )


def _print_report(report: dict[str, Any], resumed: int) -> None:
    ci = report["ci"]
    n = report["dialogues"]
    console.print(
        f"[bold]Sentient score {report['sentient_score']:.1f}[/bold] "
        f"(95% CI {ci['low']:.1f} to {ci['high']:.1f}, {n} dialogues, "
        f"{report['personas']} personas{f', {resumed} resumed' if resumed else ''})\n"
        f"success {report['successes']}/{n}, failure {report['failures']}/{n}, "
        f"goodbye {report['goodbyes']}/{n}, out of turns {report['max_turns']}/{n}, "
        f"mean turns {report['mean_turns']:.1f}"
    )
    if "must_not" in report:
        console.print(must_not_line(report["must_not"]))
    if "flagged_turns" in report:
        flagged = report["flagged_turns"]
        console.print(
            f"agent turns flagged: injection-like {flagged['injection']}, sanitised {flagged['sanitized']}, "
            f"cut to length {flagged['truncated']} of {flagged['turns']} (the turns: action_* in transcripts.jsonl)"
        )
    for title, key in (("hidden intention", "by_hidden_intention"), ("character type", "by_character_type")):
        table = Table(title=f"by {title}", title_justify="left")
        for column in (title, "dialogues", "score", "success", "failure", "turns"):
            table.add_column(column, justify="left" if column == title else "right")
        for group, stats in report[key].items():
            table.add_row(
                escape(group[:40]),
                str(stats["dialogues"]),
                f"{stats['sentient_score']:.1f}",
                str(stats["successes"]),
                str(stats["failures"]),
                f"{stats['mean_turns']:.1f}",
            )
        console.print(table)


# -- replay ----------------------------------------------------------------------------
@app.command("replay", epilog=EXIT_CODES)
def replay_command(
    logs: Annotated[
        list[Path],
        typer.Argument(
            metavar="LOG...",
            help="SAGE result logs (<simulator>_based_simulator/<model>_result.jsonl), our own "
            "transcripts.jsonl (eval) or episodes.jsonl (training), or folders of them",
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="run directory: report.json, turns.jsonl, scatter.png; rerun to resume")
    ],
    user: Annotated[str, typer.Option(help=USER_HELP)] = "rule",
    difficulty: Annotated[str, typer.Option(help=DIFFICULTY_HELP)] = "moderate",
    protocol: Annotated[
        ProtocolName, typer.Option(help="clamps the predicted change (sage: [-10, 10]) and is checked against the logs")
    ] = ProtocolName.sage,
    limit: Annotated[int | None, typer.Option(min=1, help="only the first N dialogues of each log")] = None,
    personas: Annotated[
        str | None,
        typer.Option(
            help="our own logs: the persona bank they were played with (default: the one run.json names, "
            "or the personas.jsonl beside them)"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of each turn's request (with the log, dialogue and turn)")] = 0,
    batch_size: Annotated[int, typer.Option(min=1, help="turns per call to the user; saved after each")] = 64,
    max_turns: Annotated[
        int | None,
        typer.Option(
            min=1, help="the protocol's turn limit (default its own: sage 9); a training run's env.kwargs.max_turns"
        ),
    ] = None,
) -> None:
    """Re-judge finished dialogues with another simulated user: score each log as SAGE's
    leaderboard does, re-appraise every logged agent turn with --user (given the logged
    history and emotion before it), and report the agreement with the user that played
    them, per turn and per dialogue: sign agreement, Cohen's kappa, Spearman, Pearson,
    MAE, a sign confusion table, per-log means, and Kendall's tau between the rankings
    of the tested models.

        empathy-gym replay tests/data/sage_logs --user rule --out runs/replay-rule

        empathy-gym replay runs/listener --user rule,difficulty=challenging --out runs/rejudged

    Each batch of appraisals is saved at once; rerunning the same command after a crash
    or Ctrl-C skips them and gives the same report.
    """
    from empathy_gym.evaluation.replay import TURNS, replay_logs
    from empathy_gym.user import resolve_protocol

    with _resumable("turns", f"appraised turns (if any) are saved in {out / TURNS}", out) as bars:
        judging = _judging(user, difficulty, protocol, seed, batch_size, limit)
        if max_turns is not None:
            judging["protocol"] = resolve_protocol(protocol.value, max_turns=max_turns)
        result = replay_logs(logs, personas=personas, out_dir=out, on_progress=bars.on_progress, **judging)
    _print_replay(result.report, result.resumed)
    console.print(f"wrote {out}/report.json, turns.jsonl, scatter.png")


# -- distill --------------------------------------------------------------------------
@app.command("distill", epilog=EXIT_CODES)
def distill_command(
    logs: Annotated[
        list[Path],
        typer.Argument(
            metavar="LOG...",
            help="the simulator's logs: SAGE result logs (<simulator>_based_simulator/<model>_result.jsonl), "
            "our own transcripts.jsonl (eval) or episodes.jsonl (training) played by an LLM user, or folders of them",
        ),
    ],
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="the appraiser folder (use it as --user distilled:FOLDER); rerun to resume"),
    ],
    base_model: Annotated[
        str, typer.Option(help="the base causal LM: smollm2 (offline), tiny, a path, a hub id or a .gguf file")
    ] = "smollm2",
    heldout_model: Annotated[
        list[str] | None, typer.Option(help="a tested model held out for the report (repeat; default: a fifth of them)")
    ] = None,
    personas: Annotated[str | None, typer.Option(help="our own logs: the persona bank they were played with")] = None,
    device: Annotated[str, typer.Option(help="where the base model runs: cpu, cuda")] = "cpu",
    seed: Annotated[int, typer.Option(min=0, help="seed of the split, the bad replies and the head")] = 0,
    batch_size: Annotated[int, typer.Option(min=1, help="rows per forward pass of the base model")] = 16,
) -> None:
    """Train an appraiser that judges like the simulator of LOG: the base model reads each
    logged turn (persona, dialogue, reply) once, a head on its hidden states and the rule
    user's named features learns the logged emotion change, with bad replies (word salads,
    repetition, injections...) ranked below fluent ones. Reports the agreement on tested
    models held out from the fit, beside the rule user and a lexical learner.

        empathy-gym distill ../shared/data/sage/logs --out runs/appraiser

        empathy-gym eval --policy baseline:listener --user distilled:runs/appraiser --out runs/judged

    The base model's features are saved as they are made; rerunning the same command after
    a crash or Ctrl-C skips them.
    """
    from empathy_gym.user.distill import distill

    with _resumable("turns", f"finished feature shards (if any) are saved in {out / 'features'}", out) as bars:
        result = distill(
            logs,
            out,
            base_model=base_model,
            personas=personas,
            heldout_models=heldout_model or None,
            seed=seed,
            device=device,
            batch_size=batch_size,
            on_progress=bars.on_progress,
        )
    if result.resumed:
        console.print(f"resumed: {result.resumed} feature shards were done")
    console.print(escape(result.text))
    console.print(f"wrote {out}/appraiser.json, head.safetensors, report.txt, report.json, calibration.png")


@app.command("capabilities", epilog=EXIT_CODES)
def capabilities_command(
    model: Annotated[
        str, typer.Option(help="the policy's base model: smollm2 (offline), tiny, a path, a hub id or a .gguf file")
    ] = "smollm2",
    adapter: Annotated[
        Path | None,
        typer.Option(
            help="a trained policy (a run's checkpoints/step-N/policy, LoRA or full): compares it with --model"
        ),
    ] = None,
    tasks: Annotated[
        str,
        typer.Option(
            help="lm-eval tasks, comma-separated: the offline empathy_math, empathy_humaneval, or any lm-eval "
            "task (gsm8k, humaneval, mbpp... download their data)"
        ),
    ] = "empathy_math,empathy_humaneval",
    limit: Annotated[int | None, typer.Option(min=1, help="the first LIMIT items of each task (default: all)")] = None,
    margin: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="'kept': at most this much lower (scores 0-1), by the interval")
    ] = 0.05,
    batch_size: Annotated[int, typer.Option(min=1, help="prompts per generation batch")] = 8,
    chat_template: Annotated[bool, typer.Option(help="render prompts with the model's chat template")] = False,
    device: Annotated[str, typer.Option(help="where the models run: cpu, cuda")] = "cpu",
    out: Annotated[Path | None, typer.Option("--out", "-o", help="write report.json (every item's score) here")] = None,
) -> None:
    """Math and code ability of a policy, and with --adapter whether training kept it: the
    same items, greedy, before (--model) and after (--model with --adapter), with the
    paired difference and its bootstrap interval over items (lm-evaluation-harness;
    extra capabilities).

        empathy-gym capabilities --adapter runs/smollm2-cpu-grpo/checkpoints/step-000030/policy --limit 50
    """
    import json

    from empathy_gym.agents.cli import quiet_known_noise
    from empathy_gym.evaluation import capabilities as cap

    quiet_known_noise()
    names = list(dict.fromkeys(name.strip() for name in tasks.split(",") if name.strip()))
    with _exit_codes():
        if not names:
            raise ValueError("--tasks: no task named")
        if out is not None:  # before any work: a run's scores must have somewhere to go
            from empathy_gym.evaluation.run_folder import check_holds_no_other

            check_holds_no_other(out, "capabilities")
            try:
                out.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise OSError(f"--out {out}: cannot write there ({error.strerror or error})") from None
        cap.check_tasks(names)
        before_model, after_model, tokenizer = cap.load_before_after(
            model, str(adapter) if adapter else None, device=device
        )
        options = {"limit": limit, "batch_size": batch_size, "chat_template": chat_template}
        before = cap.measure(before_model, tokenizer, names, **options)
        after = cap.measure(after_model, tokenizer, names, **options) if after_model is not None else None
    if after is None:
        console.print(escape(cap.scores_text(before)))
        report: dict[str, Any] = {"model": model, "scores": before}
    else:
        table = cap.compare(before, after, margin=margin)
        console.print(escape(f"{model} before -> with {adapter}:"))
        console.print(escape(cap.table_text(table, margin=margin)))
        report = {"model": model, "adapter": str(adapter), "table": table, "before": before, "after": after}
    if out is not None:
        with _exit_codes():
            (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {out / 'report.json'}")


@app.command("study", epilog=EXIT_CODES)
def study_command(
    study: Annotated[
        str,
        typer.Argument(
            help="a study file, or a shipped study's name (agents/studies/: ppo-vs-grpo, think, difficulty, "
            "and their -7b forms)"
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out", "-o", help="the study's folder: ARM/seed-S/{real,control} runs, table.txt; rerun to resume"
        ),
    ],
    seeds: Annotated[
        str | None, typer.Option(help="training seeds, comma-separated, instead of the file's (e.g. 0,1,2)")
    ] = None,
    jobs: Annotated[
        int, typer.Option(min=1, help="runs trained at once (each with OMP_NUM_THREADS = cores / jobs)")
    ] = 1,
    plan: Annotated[bool, typer.Option("--plan", help="print the runs and their commands; train nothing")] = False,
    arms: Annotated[
        str | None,
        typer.Option(help="train and tabulate only these arms, comma-separated; the whole study reads their runs back"),
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="recipe overrides for every arm, key=value (e.g. total_steps=10)")
    ] = None,
) -> None:
    """Compare arms (recipes or settings) over training seeds, each seed with its control
    (shuffled rewards), and print one table: the held-out difference under every judge (a
    judge-by-judge matrix), real minus control, capabilities and monitors, with t intervals
    over seeds.

        empathy-gym study ppo-vs-grpo --out runs/study-ppo-vs-grpo --jobs 2
    """
    import json
    import shlex

    from empathy_gym.agents.study import StudyRunError, check_unchanged, load_study, run_study, study_table

    with _exit_codes():
        try:
            chosen = [int(seed) for seed in seeds.split(",")] if seeds is not None else None
        except ValueError:
            raise ValueError(f"--seeds {seeds!r}: expected integers separated by commas, e.g. 0,1,2") from None
        picked = [arm.strip() for arm in arms.split(",")] if arms is not None else None
        loaded = load_study(study, out, seeds=chosen, overrides=list(overrides or []), arms=picked)
        check_unchanged(loaded)
    console.print(escape(f"study {loaded.source}: {loaded.size()} in {out}"))
    if plan:
        for run in loaded.runs:
            done = " (done)" if loaded.done(run) else " (judges to add)" if run.report() is not None else ""
            console.print(escape(f"{run.name}{done}: {shlex.join(['python', *run.command()[1:]])}"), soft_wrap=True)
        return
    with _exit_codes(interrupted=f"interrupted; the runs saved checkpoints in {out}; rerun to resume"):
        try:
            times = run_study(loaded, jobs=jobs, say=lambda line: console.print(escape(line)))
        except StudyRunError as error:
            raise ValueError(str(error)) from None
        table = study_table(loaded)
        saved = out / "study.json"
        seconds = json.loads(saved.read_text(encoding="utf-8")).get("seconds", {}) if saved.exists() else {}
        names = {run.name for run in loaded.runs}
        seconds = {name: value for name, value in {**seconds, **times}.items() if name in names}
        record = {k: v for k, v in table.items() if k != "text"} | {"seconds": seconds}
        saved.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        (out / "table.txt").write_text(table["text"] + "\n", encoding="utf-8")
    console.print(escape(table["text"]), soft_wrap=True)
    console.print(f"wrote {out}/table.txt, study.json")


def _number(value: Any, digits: int = 2) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


def _print_replay(report: dict[str, Any], resumed: int) -> None:
    from empathy_gym.evaluation.replay import ENDS_EARLY

    console.print(_logs_table(report["logs"]))
    for row in report["logs"]:
        for why, count in row.get("protocol_mismatches", {}).items():
            hint = (
                " (fewer turns than the protocol's limit: give the run's as --max-turns)" if why == ENDS_EARLY else ""
            )
            console.print(
                f"{escape(row['name'])}: {count} of {row['dialogues']} dialogues not replayed: {why}{hint}; "
                "their turns are re-judged all the same"
            )
    console.print(_agreement_table(report, resumed))
    confusion = Table(title="signs: logged (rows) against predicted (columns), all logs", title_justify="left")
    confusion.add_column("logged")
    for sign in ("-", "0", "+"):
        confusion.add_column(sign, justify="right")
    for sign, row in report["agreement"]["confusion"].items():
        confusion.add_row(sign, *(str(row[s]) for s in ("-", "0", "+")))
    console.print(confusion)


def _logs_table(logs: list[dict[str, Any]]) -> Table:
    table = Table(
        title="logs: leaderboard numbers, and the same dialogues replayed through our protocol with the logged changes",
        title_justify="left",
    )
    columns = ("log", "dialogues", "score", "success", "failure", "replayed", "turns")
    for column in (*columns, "logged mean", "predicted mean", "sign agree"):
        table.add_column(column, justify="left" if column == "log" else "right")
    for row in logs:
        table.add_row(
            escape(row["name"]),
            str(row["dialogues"]),
            f"{row['score']:.2f}",
            str(row["success"]),
            str(row["failure"]),
            f"{row['protocol_matches']}/{row['dialogues']}",
            str(row["turns"]),
            *(_number(row[key]) for key in ("mean_logged", "mean_predicted", "sign_agreement")),
        )
    return table


_AGREEMENT_COLUMNS = {
    "sign agree": "sign_agreement",
    "sign agree (logged != 0)": "sign_agreement_nonzero",
    "chance": "chance_agreement",
    "kappa": "cohen_kappa",
    "Spearman": "spearman",
    "Pearson": "pearson",
    "MAE": "mae",
    "Kendall tau (change)": "kendall_tau",
    "Kendall tau (score)": "kendall_tau_score",
}


def _agreement_table(report: dict[str, Any], resumed: int) -> Table:
    table = Table(
        title=f"agreement with the logged changes ({report['turns']} turns"
        f"{f', {resumed} resumed' if resumed else ''}); per dialogue: the sums over each dialogue",
        title_justify="left",
    )
    table.add_column("simulator")
    table.add_column("turns", justify="right")
    for column in _AGREEMENT_COLUMNS:
        table.add_column(column, justify="right")
    rows = [("all logs", report["agreement"])] + list(report["by_simulator"].items())
    rows.append(("all logs, per dialogue", {**report["dialogue_agreement"], "kendall_tau_score": None}))
    for name, stats in rows:
        table.add_row(escape(name), str(stats["turns"]), *(_number(stats[key]) for key in _AGREEMENT_COLUMNS.values()))
    return table


def _check_dialogue_env(env_id: str) -> None:
    """Raises ValueError naming ``--env`` when ``env_id`` is not a registered dialogue env
    (gymnasium's own suggestion would be the closest of every env, e.g. Hopper)."""
    import gymnasium as gym

    import empathy_gym  # noqa: F401  (registers the ids)
    from empathy_gym.registration import ENTRY_POINT

    ours = sorted(name for name, spec in gym.registry.items() if spec.entry_point == ENTRY_POINT)
    if env_id not in ours:
        raise ValueError(f"--env {env_id}: not a dialogue env; the registered ones: {', '.join(ours)}")


# -- serve -----------------------------------------------------------------------------
SERVE_ENV = "EMPATHY_GYM_SERVE_"


def _serve_option(name: str, **kwargs: Any) -> Any:
    """A ``serve`` option that its variable ``EMPATHY_GYM_SERVE_<NAME>`` can also give (how
    a container or an OpenEnv Space sets it)."""
    return typer.Option(
        *([name] if name.startswith("--") else []),
        envvar=SERVE_ENV + name.lstrip("-").replace("-", "_").upper(),
        show_envvar=True,
        **kwargs,
    )


@app.command(epilog=EXIT_CODES)
def serve(
    env_id: Annotated[str, _serve_option("--env", help="a registered id (see `empathy-gym envs`)")] = (
        "EmpathyDialogue-v0"
    ),
    user: Annotated[str | None, _serve_option("user", help=USER_HELP + "; default: the env's own")] = None,
    personas: Annotated[str | None, _serve_option("personas", help=PERSONAS_HELP + "; default: the env's own")] = None,
    difficulty: Annotated[
        str | None, _serve_option("difficulty", help=DIFFICULTY_HELP + "; default: the env's own")
    ] = None,
    host: Annotated[
        str, _serve_option("host", help="address to bind (another than 127.0.0.1 opens it to the network)")
    ] = "127.0.0.1",
    port: Annotated[int, _serve_option("port", min=0, max=65535)] = 8000,
    max_sessions: Annotated[
        int, _serve_option("max_sessions", min=1, help="concurrent WebSocket sessions (one dialogue each)")
    ] = 64,
    batch_window_ms: Annotated[
        float,
        _serve_option(
            "batch_window_ms",
            min=0,
            max=10_000,
            help="how long a turn waits for other sessions' turns to reach the user with it",
        ),
    ] = 5.0,
    token: Annotated[
        str | None,
        _serve_option(
            "token",
            help="require `Authorization: Bearer TOKEN` on every route but /health (prefer the variable: "
            "a command line is visible to other users)",
        ),
    ] = None,
    max_action_chars: Annotated[int, _serve_option("max_action_chars", min=1, help="the longest utterance taken")] = (
        8192
    ),
    max_body_bytes: Annotated[
        int, _serve_option("max_body_bytes", min=1, help="the largest request body and WebSocket message")
    ] = 1 << 20,
    idle_timeout_s: Annotated[
        float,
        _serve_option("idle_timeout_s", min=0, help="a session idle this long expires and frees its slot (0: never)"),
    ] = 600.0,
    log_dialogues: Annotated[
        Path | None, _serve_option("log_dialogues", help="append every finished dialogue to this JSONL file as it ends")
    ] = None,
) -> None:
    """Serve the env to OpenEnv clients (HTTP and WebSocket; TRL's environment path): every
    session plays its own dialogue, and all of them share one simulated user, whose turns
    arrive together. Needs `pip install 'empathy-gym[openenv]'`. SIGTERM or Ctrl-C stops it
    once the running turns are answered (exit code 0); a second one at once (130). Every
    option can also be given by its variable (EMPATHY_GYM_SERVE_PORT, ...; docs/integrations.md
    lists them); the command line wins.
    """
    with _exit_codes():
        application = _serve_app(
            env_id=env_id,
            user=user,
            personas=personas,
            difficulty=difficulty,
            batch_window_ms=batch_window_ms,
            max_sessions=max_sessions,
            token=token,
            max_action_chars=max_action_chars,
            max_body_bytes=max_body_bytes,
            idle_timeout_s=idle_timeout_s,
            log_dialogues=log_dialogues,
        )
        from empathy_gym.integrations.openenv import run_server

        run_server(application, host=host, port=port, max_message_bytes=max_body_bytes)


def _serve_app(
    *,
    env_id: str,
    user: str | None,
    personas: str | None,
    difficulty: str | None,
    batch_window_ms: float,
    max_sessions: int,
    token: str | None,
    max_action_chars: int,
    max_body_bytes: int,
    idle_timeout_s: float,
    log_dialogues: Path | None,
) -> Any:
    _check_dialogue_env(env_id)
    if token is None and os.environ.get(SERVE_ENV + "TOKEN") is not None:  # click reads "" as unset
        raise ValueError(
            f"{SERVE_ENV}TOKEN: empty (an unset secret expanded to nothing?); give a token, or unset the "
            "variable for a server without one"
        )
    from empathy_gym.integrations.openenv import make_app

    config: dict[str, Any] = {"env_id": env_id, "batch_window_ms": batch_window_ms}
    for name, value in (("user", user), ("personas", personas), ("difficulty", difficulty)):
        if value is not None:
            config[name] = value
    return make_app(
        config,
        max_sessions=max_sessions,
        token=token,
        max_action_chars=max_action_chars,
        max_body_bytes=max_body_bytes,
        idle_timeout_s=idle_timeout_s or None,
        log_dialogues=log_dialogues,
    )


def serve_app_from_environ() -> tuple[Any, dict[str, Any]]:
    """The app ``empathy-gym serve`` runs, with its options read from the
    ``EMPATHY_GYM_SERVE_*`` variables alone (``empathy-gym serve --help`` lists them): what
    an OpenEnv deployment imports (``deploy/empathy_env/server/app.py``).

    Returns:
        ``(app, run)``: the FastAPI app and the keywords of
        :func:`~empathy_gym.integrations.openenv.run_server` (``host``, ``port``,
        ``max_message_bytes``).

    Raises:
        ValueError: a variable's value is not valid for its option (the message names the
            variable). As :func:`~empathy_gym.integrations.openenv.make_app`.
    """
    group = typer.main.get_command(app)
    command = group.get_command(typer.Context(group), "serve")
    try:
        params = dict(command.make_context("serve", []).params)
    except typer.BadParameter as error:  # its message names the option and the variable
        raise ValueError(error.format_message()) from None
    host, port = params.pop("host"), params.pop("port")
    return _serve_app(**params), {"host": host, "port": port, "max_message_bytes": params["max_body_bytes"]}


# -- play ------------------------------------------------------------------------------
PLAY_HELP = "commands: /restart (a new dialogue), /quit (or Ctrl-D), /help"


@app.command(epilog=EXIT_CODES)
def play(
    env_id: Annotated[
        str, typer.Option("--env", help="a registered id (see `empathy-gym envs`)")
    ] = "EmpathyDialogue-v0",
    persona: Annotated[
        str | None,
        typer.Option(
            help="a persona id of that env's bank (see `empathy-gym personas list`); default: drawn at random"
        ),
    ] = None,
    user: Annotated[str | None, typer.Option(help=USER_HELP + "; default: the env's own")] = None,
    seed: Annotated[int | None, typer.Option(min=0, help="seed of the first dialogue (then +1 per /restart)")] = None,
    thoughts: Annotated[
        bool, typer.Option(help="show the user's appraisal (inner thoughts, proposed change) each turn")
    ] = False,
) -> None:
    """Talk with the simulated user yourself: you are the agent. Type a reply and press
    Enter (a reply is one line, also when piped in); the user answers and the emotion bar
    shows where you stand (0-100; the dialogue ends at 100, below 10, when the user says
    goodbye, or after the turn limit). /restart starts a new dialogue, /quit (or Ctrl-D)
    leaves. Works offline with the rule user.
    """
    import gymnasium as gym

    with _exit_codes():
        _check_dialogue_env(env_id)
        env = gym.make(env_id, **({"user": user} if user else {})).unwrapped
        if persona and persona not in {p.id for p in env.personas}:
            raise ValueError(
                f"--persona {persona!r}: not in {env_id}'s {len(env.personas)} personas; "
                f"see `empathy-gym personas list`"
            )
        options = {"persona": persona} if persona else None
        episode = 0
        try:
            while True:
                obs, info = env.reset(seed=None if seed is None else seed + episode, options=options)
                chosen = env.dialogue.persona
                console.rule(
                    f"{escape(env_id)}: persona {escape(chosen.id)}{f' ({escape(chosen.name)})' if chosen.name else ''}"
                )
                console.print(f"[dim]{PLAY_HELP}[/dim]")
                _print_user(obs, info)
                if _play_dialogue(env, thoughts) == "quit":
                    return
                episode += 1
        finally:
            env.close()


def _print_user(utterance: str, info: dict[str, Any], max_turns: int | None = None) -> None:
    """The user's utterance, then the emotion bar (with the change and turn after a step)."""
    from empathy_gym.env import emotion_bar

    console.print(f"[bold cyan]USER[/]: {escape(utterance)}")
    after_step = f"  ({info['emotion_change']:+d}, turn {info['turn']}/{max_turns})" if "emotion_change" in info else ""
    console.print(f"      {escape(emotion_bar(info['emotion']))}{after_step}")


def hidden_need_line(persona: Any) -> str:
    """The persona's hidden intention (in English) and character type."""
    return f"Hidden need: {persona.intention_text('en')}; character: {persona.character_type}."


def _reveal_if_left(env: Any, ended: bool) -> None:
    """Show the hidden need of a dialogue left before its end (the end shows it itself)."""
    if not ended:
        console.print(f"[bold]you left the dialogue.[/bold] {escape(hidden_need_line(env.dialogue.persona))}")


def _play_dialogue(env: Any, thoughts: bool) -> str:
    """Read the player's lines until /restart (returns "restart"), /quit, end of input or
    a console nobody reads any more (``| head``) (returns "quit")."""
    ended = False
    while not getattr(sys.stdout, "broken", False):  # main()'s ConsoleStream: nobody reads any more
        try:
            text = console.input("[bold green]you>[/] ").strip()
        except EOFError:
            console.print()
            _reveal_if_left(env, ended)
            return "quit"
        if text in ("/quit", "/restart"):
            _reveal_if_left(env, ended)
            return text[1:]
        if text.startswith("/") and " " not in text:  # /help and unknown commands
            console.print(f"[dim]{PLAY_HELP}[/dim]")
            continue
        if not text:
            continue
        if ended:
            console.print("[dim]the dialogue has ended: /restart or /quit[/dim]")
            continue
        obs, _, terminated, truncated, info = env.step(text)
        if thoughts:
            appraisal = info["appraisal"]
            console.print(
                f"[dim]      (thinks: {escape(appraisal['thoughts'] or '-')}; proposed {appraisal['change']:+d})[/dim]"
            )
        _print_user(obs, info, env.protocol.max_turns)
        if terminated or truncated:
            ended = True
            outcome = {
                "success": "success: the user feels better and says goodbye",
                "failure": "failure: the user gives up and leaves",
                "goodbye": "the user says goodbye",
                "max_turns": "out of turns",
            }[info["termination_reason"]]
            console.print(
                f"[bold]{outcome}[/bold] (final emotion {info['emotion']}). "
                f"{escape(hidden_need_line(env.dialogue.persona))}"
            )
            console.print("[dim]/restart for a new dialogue, /quit to leave[/dim]")
    return "quit"


# -- personas --------------------------------------------------------------------------
@personas_app.command("validate", epilog=EXIT_CODES)
def personas_validate(
    paths: Annotated[
        list[Path], typer.Argument(metavar="PATH", help="JSONL persona files (our format or RLVER/SAGE's)")
    ],
) -> None:
    """Check persona files: JSON on every line, every field against the schema, known
    labels, unique ids. Prints FILE:LINE: field 'NAME': problem for every invalid line
    (its first problem); exit code 1 when any file is invalid.
    """
    from empathy_gym.personas import check_personas_file

    invalid = 0
    for path in paths:
        try:
            bank, problems = check_personas_file(path)
        except OSError as error:
            problems = [f"{path}: {error.strerror}"]
        if problems:
            for problem in problems:
                errors.print(f"[red]invalid:[/red] {escape(str(problem))}")
            invalid += 1
            continue
        languages = Counter(p.language for p in bank)
        console.print(
            f"[green]ok:[/green] {escape(str(path))}: {len(bank)} persona{'s' if len(bank) != 1 else ''} ("
            + ", ".join(f"{n} {lang}" for lang, n in sorted(languages.items()))
            + ")"
        )
    if invalid:
        raise typer.Exit(1)


@personas_app.command("list", epilog=EXIT_CODES)
def personas_list(
    bank: Annotated[
        str | None, typer.Option(help=PERSONAS_HELP + "; default: the built-in English and Chinese banks")
    ] = None,
) -> None:
    """List a bank's personas: id, language, name, hidden intention, character type.

    On a terminal, a table; piped or redirected, one tab-separated line per persona
    after a header line (nothing wrapped or cut, for ``cut``, ``grep`` and ``awk``)."""
    from empathy_gym.personas import load_personas

    with _exit_codes():
        personas = load_personas(bank)
    if not console.is_terminal:
        lines = ["id\tlang\tname\thidden_intention\tcharacter"]
        lines += [
            "\t".join(
                " ".join(str(v).split()) for v in (p.id, p.language, p.name or "", p.hidden_intention, p.character_type)
            )
            for p in personas
        ]
        typer.echo("\n".join(lines))
        return
    table = Table(title=f"{len(personas)} persona{'s' if len(personas) != 1 else ''}", title_justify="left")
    table.add_column("id", no_wrap=True)
    for column in ("lang", "name", "hidden intention", "character"):
        table.add_column(column, overflow="fold")
    for p in personas:
        table.add_row(
            escape(p.id),
            p.language,
            escape(p.name or ""),
            escape(p.hidden_intention if p.intention_is_standard else p.hidden_intention[:30]),
            p.character_type,
        )
    console.print(table)


@personas_app.command("show", epilog=EXIT_CODES)
def personas_show(
    persona_id: Annotated[str, typer.Argument(metavar="ID", help="the persona's id")],
    bank: Annotated[str | None, typer.Option(help=PERSONAS_HELP + "; default: search en, zh, rlver")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the persona as one JSON object (our format)")] = False,
) -> None:
    """Show one persona in full (profile, scenario, hidden intention, opening line)."""
    from empathy_gym.personas import BUILTIN_BANKS, load_personas

    with _exit_codes():
        banks = [bank] if bank else list(BUILTIN_BANKS)
        for name in banks:
            found = [p for p in load_personas(name) if p.id == persona_id]
            if found:
                break
        else:
            raise KeyError(
                f"no persona {persona_id!r} in {', '.join(banks)}; see `empathy-gym personas list --bank NAME`"
            )
    persona = found[0]
    if as_json:
        console.print_json(json.dumps(persona.to_dict(), ensure_ascii=False))
        return
    table = Table(show_header=False, box=None)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    record = persona.to_dict()
    record["hidden_intention"] = (
        f"{persona.hidden_intention} ({persona.intention_text('en')})"
        if persona.intention_is_standard
        else persona.hidden_intention
    )
    for key, value in record.items():
        table.add_row(key, escape(", ".join(value) if isinstance(value, (list, tuple)) else str(value)))
    console.print(table)


# -- envs ------------------------------------------------------------------------------
@app.command(epilog=EXIT_CODES)
def envs() -> None:
    """List the registered dialogue environment ids with their difficulty, persona count
    and simulated user."""
    import gymnasium as gym

    import empathy_gym  # noqa: F401  (registers the ids)
    from empathy_gym.personas import load_personas
    from empathy_gym.registration import ENTRY_POINT
    from empathy_gym.user import SimulatedUser
    from empathy_gym.user.difficulty import load_difficulty
    from empathy_gym.user.specs import as_user_spec

    table = Table()
    for column in ("id", "difficulty", "personas", "languages", "user"):
        table.add_column(column)
    with _exit_codes():
        for env_id, spec in sorted(gym.registry.items()):
            if spec.entry_point != ENTRY_POINT:
                continue
            kwargs = spec.kwargs or {}
            bank = load_personas(kwargs.get("personas"))
            user = kwargs.get("user", "rule")
            table.add_row(
                env_id,
                load_difficulty(kwargs.get("difficulty", "moderate")).name,
                str(len(bank)),
                language_counts(bank),
                user
                if isinstance(user, str)
                else type(user).__name__
                if isinstance(user, SimulatedUser)
                else str(as_user_spec(user)),
            )
    console.print(table)
    for env_id, spec in sorted(gym.registry.items()):  # the other kinds, e.g. EmpathyStrategy-v0
        if str(spec.entry_point).startswith("empathy_gym") and spec.entry_point != ENTRY_POINT:
            console.print(f"also {env_id} ({spec.entry_point})")


def main() -> None:
    """The console script ``empathy-gym`` (exit codes: :data:`EXIT_CODES`)."""
    from empathy_gym.agents.console import honour_interrupts, tolerant_console

    honour_interrupts()
    code: int | str | None = 0
    with tolerant_console() as (stdout, _):  # a console gone (| head, | tee) ends no run half-way
        try:
            app(prog_name="empathy-gym")
        except SystemExit as exit_:
            code = exit_.code
    sys.exit(PIPE_CLOSED if code in (0, None) and stdout.broken else code)


if __name__ == "__main__":
    main()
