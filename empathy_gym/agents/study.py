"""Studies: one command that trains several arms (recipes, or one recipe with other
settings) over several training seeds, each seed also with its control, and prints one
table (``empathy-gym study``; docs/evaluation.md, "Studies").

A study file (shipped ones in ``agents/studies/``; any path)::

    description: PPO against GRPO on the quick start's settings
    seeds: [0, 1, 2]
    control: true                 # each arm and seed also trained with shuffled rewards
    judges: [distilled, "rule,difficulty=challenging"]
    overrides: [total_steps=30]   # for every arm
    arms:
      grpo: {recipe: smollm2-cpu-grpo}
      ppo: {recipe: smollm2-cpu-ppo-matched}

Each run trains in ``OUT/ARM/seed-S/real`` (or ``control``) as its own process: the
training command with ``seed=S`` and ``output_dir=`` that folder; a control trains with
:func:`~empathy_gym.agents.controls.shuffled_reward_trainer`. A run whose held-out
report exists is read back; a run stopped half-way resumes (``--resume``); a run started
with other settings (``study_run.json`` in its folder) is refused, but for the judges: a
judge added to a finished study is played by each run's policy before training and its
last checkpoint (a resumed run with nothing left to train), the other files read back.
Every arm must hold out the same personas and dialogues (``heldout`` bank, split and
seeds), so that the arms are compared on the same evaluation; a run starts with a finished
run's evaluation before training where it was made with the same settings
(:func:`copy_before`).

The table (:func:`study_table`): the held-out difference (after - before, emotion points)
under the training user and every judge, one row per arm and one column per judge (a
judge-by-judge matrix; the arm's own training user marked ``*``), real minus control paired
by seed, each pair of arms' real runs against each other paired by seed, the capability
change (``heldout.capabilities``) and the monitors after training, each as the mean over
training seeds with a Student t interval over seeds (the spread between training runs,
which one run's interval over personas does not show).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from empathy_gym.agents.config import (
    ALGORITHMS,
    HELDOUT_DIR,
    RecipeError,
    load_recipe,
    override_key,
    read_yaml,
    yaml_line,
)
from empathy_gym.agents.heldout import evaluation_files, saved_settings
from empathy_gym.evaluation.run_folder import RUN_CONFIG, folder_lock, holds_a_run, write_json
from empathy_gym.resources import recipes_dir
from empathy_gym.user.specs import SpecError, as_user_spec

#: The ``heldout`` fields every arm must share: the same personas, dialogues and seeds.
SHARED_HELDOUT = ("bank", "test_fraction", "split_seed", "repeats", "seed")
#: The file in each run's folder that records what it was started with.
STUDY_RUN = "study_run.json"
#: An arm's name: its runs' folder under the study's (no path separators, no dot-dot).
ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
ARM_NAME_RULE = "letters, digits, '_', '.' and '-', starting with a letter or digit (it names the arm's folder)"
#: The monitors the table shows (``report.json``'s ``monitors.after``).
TABLE_MONITORS = ("monitor/self_repeat_share", "monitor/parrot_share", "monitor/nonword_share", "monitor/distinct_2")


@dataclass
class ArmConfig:
    """One arm: a recipe (a path or a shipped recipe's name), the overrides that make it
    this arm, and ``algorithm`` (``ppo``/``grpo``) for a recipe that does not name one."""

    recipe: str = MISSING
    overrides: list[str] = field(default_factory=list)
    algorithm: str | None = None


@dataclass
class StudyConfig:
    """A study file's fields.

    Attributes:
        description: what the study compares (printed above its table).
        seeds: the training seeds (``seed=``) of every arm, at least one; two or more
            for an interval over seeds.
        control: also train each arm and seed with shuffled rewards.
        judges: user specs that judge every arm's held-out dialogues (``heldout.judges``);
            each arm's own training user is a column too.
        overrides: recipe overrides (``key=value``) for every arm, before the arm's own.
        arms: name -> :class:`ArmConfig`, at least one.
    """

    description: str = ""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    control: bool = True
    judges: list[Any] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    arms: dict[str, ArmConfig] = field(default_factory=dict)


class StudyError(RecipeError):
    """A study file, or one of its arms, is invalid; the message names the file, the line or
    the arm, and the field."""


@dataclass(frozen=True)
class Run:
    """One training run of a study: an arm, a seed, real or control, and its folder."""

    arm: str
    seed: int
    control: bool
    algorithm: str
    recipe: str
    overrides: tuple[str, ...]
    output_dir: Path

    @property
    def name(self) -> str:
        return f"{self.arm}/seed-{self.seed}/{'control' if self.control else 'real'}"

    @property
    def report_path(self) -> Path:
        return self.output_dir / HELDOUT_DIR / "report.json"

    def report(self) -> dict[str, Any] | None:
        """The run's held-out report, ``None`` while it has none that reads (not finished,
        or cut short by a crash while it was written)."""
        try:
            report = json.loads(self.report_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return report if isinstance(report, dict) and "difference" in report else None

    @property
    def settings(self) -> dict[str, Any]:
        """What the run trains with, as ``study_run.json`` in its folder records it."""
        return {
            "recipe": self.recipe,
            "algorithm": self.algorithm,
            "control": self.control,
            "overrides": list(self.overrides),
        }

    def changed(self) -> list[str]:
        """How this run's settings differ from those its folder was started with
        (``study_run.json``): the overrides and fields that differ; empty when they do not
        or the folder records none."""
        try:
            made = json.loads((self.output_dir / STUDY_RUN).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        now = self.settings
        changed = [
            f"{key} {made.get(key)!r} -> {now[key]!r}"
            for key in ("recipe", "algorithm", "control")
            if made.get(key) != now[key]
        ]
        old, new = (_training_overrides(settings.get("overrides", [])) for settings in (made, now))
        changed += [f"no longer {o}" for o in old if o not in new] + [f"now {o}" for o in new if o not in old]
        return changed

    def command(self) -> list[str]:
        """The child process's command line (``--resume`` when its folder holds a run)."""
        resume = ["--resume"] if holds_a_run(self.output_dir) else []
        kind = "control" if self.control else "real"
        return [sys.executable, "-m", __name__, self.algorithm, kind, "--recipe", self.recipe, *resume, *self.overrides]


def _training_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides but ``heldout.judges``: the judges evaluate a run, they do not train it."""
    return [o for o in overrides if override_key(o) != "heldout.judges"]


@dataclass
class Study:
    """A loaded study: its config and file, the training user of each arm (a spec
    string), the judges' columns, the runs in order, each arm's files of the
    evaluation before training with their settings
    (:func:`~empathy_gym.agents.heldout.evaluation_files`), and each arm's ``total_steps``."""

    config: StudyConfig
    source: Path
    users: dict[str, str]
    columns: list[str]
    runs: list[Run]
    before: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)

    def done(self, run: Run) -> bool:
        """Whether ``run`` has its report, and it holds the difference under every judge column."""
        report = run.report()
        user = self.users[run.arm]
        return report is not None and all(
            judged_difference(report, column, user) is not None for column in self.columns
        )

    def size(self) -> str:
        """``"2 arms x 3 seeds x (real, control) = 12 runs"``."""
        arms, seeds = len(self.config.arms), len(self.config.seeds)
        control = " x (real, control)" if self.config.control else ""
        return f"{_counted(arms, 'arm')} x {_counted(seeds, 'seed')}{control} = {_counted(len(self.runs), 'run')}"


def _counted(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def find_study(name: str | os.PathLike) -> Path:
    """A study by path, or by the name of a shipped one (``agents/studies/NAME.yaml``).

    Raises:
        FileNotFoundError: neither; the message lists the shipped studies.
    """
    path = Path(name)
    if path.is_file():
        return path
    shipped = recipes_dir() / "studies"
    candidate = shipped / f"{path.name.removesuffix('.yaml')}.yaml"
    if candidate.is_file():
        return candidate
    names = ", ".join(sorted(p.stem for p in shipped.glob("*.yaml")))
    raise FileNotFoundError(f"no study {str(name)!r}: not a file here, and not a shipped study ({names})")


def read_study(source: Path) -> StudyConfig:
    """The study file at ``source``, checked against :class:`StudyConfig`.

    Raises:
        StudyError: bad YAML, an unknown field, a wrong type, no arm or no seed, naming
            the file, line and field.
    """
    data = read_yaml(source, StudyError) or {}
    if not isinstance(data, dict):
        raise StudyError(f"{source}: a study must be a mapping of fields (description, seeds, arms, ...)")
    try:
        config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(StudyConfig), OmegaConf.create(data)))
    except (OmegaConfBaseException, TypeError) as error:  # TypeError: a list given for a mapping, or back
        key = getattr(error, "full_key", None) or next((k for k in data if _wrong_container(k, data[k])), "?")
        line = yaml_line(source, str(key))
        raise StudyError(f"{source}{f':{line}' if line else ''}: field {key!r}: {str(error).splitlines()[0]}") from None
    problems = [("arms", "no arm: name at least one (arms: {NAME: {recipe: ...}})")] if not config.arms else []
    problems += [("seeds", problem) for problem in seed_problems(config.seeds)]
    problems += [
        ("arms", f"arm name {name!r}: {ARM_NAME_RULE}") for name in config.arms if not ARM_NAME.fullmatch(name)
    ]
    problems += [(f"judges[{i}]", "null is not a user spec") for i, j in enumerate(config.judges) if j is None]
    for name, problem in problems:
        line = yaml_line(source, name)
        raise StudyError(f"{source}{f':{line}' if line else ''}: field {name!r}: {problem}")
    return config


def _wrong_container(key: str, value: Any) -> bool:
    """Whether a top-level study field holds a list where a mapping belongs, or back."""
    expected = {"arms": dict, "seeds": list, "judges": list, "overrides": list}.get(key)
    return expected is not None and isinstance(value, (dict, list)) and not isinstance(value, expected)


def seed_problems(seeds: Sequence[int]) -> list[str]:
    """What is wrong with a study's training seeds: none, one given twice, or one outside
    [0, 2**32 - 1] (what seeds numpy and torch)."""
    problems = [] if seeds else ["no training seed"]
    if len(set(seeds)) != len(seeds):
        problems.append(f"a seed given twice: {list(seeds)}")
    problems += [f"seed {seed} is outside [0, 2**32 - 1]" for seed in seeds if not 0 <= seed < 2**32]
    return problems


def _spec_text(spec: Any, where: str) -> str:
    """A user spec as the string that parses back to it (``heldout.judges`` takes it)."""
    try:
        text = str(as_user_spec(spec))
        if as_user_spec(text) != as_user_spec(spec):
            raise SpecError(f"{spec!r} does not read back from its text {text!r}; give it as a spec string")
    except (SpecError, TypeError) as error:
        raise StudyError(f"{where}: {error}") from None
    return text


def load_study(
    name: str | os.PathLike,
    out: str | os.PathLike,
    *,
    seeds: Sequence[int] | None = None,
    overrides: Sequence[str] = (),
    arms: Sequence[str] | None = None,
) -> Study:
    """Read a study and check every arm's recipe before anything trains.

    Args:
        name: the study file, or a shipped study's name (:func:`find_study`).
        out: the study's folder; run ``ARM/seed-S/{real,control}`` trains under it.
        seeds: replace the file's training seeds.
        overrides: recipe overrides for every arm, after the file's (``total_steps=2``).
        arms: train and tabulate only these arms (``None``: all). Their runs are the
            whole study's, judged by every arm's training user too, so that the whole study
            in the same ``out`` reads them back.

    Raises:
        StudyError: as :func:`read_study`; an arm whose recipe does not load (the recipe's
            own message, with the arm's name), without ``heldout.bank``, or holding out other
            personas or dialogues than the first arm; an arm in ``arms`` the study lacks.
        FileNotFoundError: no such study.
    """
    source = find_study(name)
    config = read_study(source)
    if seeds is not None:
        problems = seed_problems(list(seeds))
        if problems:
            raise StudyError(f"--seeds: {'; '.join(problems)}")
        config.seeds = list(seeds)
    for where, given in [("overrides", [*config.overrides, *overrides])] + [
        (f"arms.{name}.overrides", arm.overrides) for name, arm in config.arms.items()
    ]:
        taken = [o for o in given if override_key(o) in ("seed", "output_dir", "heldout.judges")]
        if taken:
            raise StudyError(
                f"{source}: {where}: {taken[0]!r}: the study sets each run's seed, output_dir and "
                "heldout.judges itself (name judges in the study's judges:)"
            )
    loaded, users = {}, {}
    for arm_name, arm in config.arms.items():
        loaded[arm_name] = _load_arm(source, arm_name, [*config.overrides, *arm.overrides, *overrides], arm)
        users[arm_name] = _spec_text(loaded[arm_name].env.user_spec(), f"{source}: arm {arm_name!r}: env.kwargs.user")
    _check_same_heldout(source, loaded)
    columns = list(dict.fromkeys(_spec_text(j, f"{source}: field 'judges[{i}]'") for i, j in enumerate(config.judges)))
    columns += [user for user in dict.fromkeys(users.values()) if user not in columns]
    before, planned, steps = {}, {}, {}
    for arm_name, arm in config.arms.items():
        where = f"{source}: arm {arm_name!r}: heldout.user"
        second = loaded[arm_name].heldout.user
        others = [c for c in columns if c not in (users[arm_name], second and _spec_text(second, where))]
        others = _in_recorded_order(others, Path(out) / arm_name)
        quoted = ",".join("'" + j.replace("'", "''") + "'" for j in others)  # YAML's single quotes: '' is '
        arm_overrides = [*config.overrides, *arm.overrides, *overrides, f"heldout.judges=[{quoted}]"]
        recipe = _load_arm(source, arm_name, arm_overrides, arm)  # checked with its judges
        before[arm_name] = evaluation_files(recipe, "before")
        steps[arm_name] = recipe.total_steps
        planned[arm_name] = ({cls: name for name, cls in ALGORITHMS.items()}[type(recipe)], arm_overrides)
    if arms is not None:
        unknown = [arm for arm in arms if arm not in config.arms] or ([] if arms else ["(none)"])
        if unknown:
            raise StudyError(f"--arms: no arm {unknown[0]!r} in {source}; its arms: {', '.join(config.arms)}")
        config.arms = {name: arm for name, arm in config.arms.items() if name in arms}
        users = {name: user for name, user in users.items() if name in arms}
        planned = {name: plan for name, plan in planned.items() if name in arms}
    runs = []
    for seed in config.seeds:  # seed by seed: a study stopped half-way holds every arm's first seeds
        for arm_name, (algorithm, arm_overrides) in planned.items():
            for control in (False, True) if config.control else (False,):
                folder = Path(out) / arm_name / f"seed-{seed}" / ("control" if control else "real")
                run_overrides = (*arm_overrides, f"seed={seed}", f"output_dir={folder}")
                runs.append(
                    Run(arm_name, seed, control, algorithm, config.arms[arm_name].recipe, run_overrides, folder)
                )
    return Study(config, source, users, columns, runs, before, steps)


def _in_recorded_order(judges: list[str], arm_folder: Path) -> list[str]:
    """``judges`` in the order a run of the arm already recorded (``study_run.json``), new
    ones last: each judge keeps its index, so its files (``heldout/*_judges<i>.jsonl``) are
    read back and a judge added to the study is the only one played."""
    for made in sorted(arm_folder.glob(f"seed-*/*/{STUDY_RUN}")):
        try:
            overrides = json.loads(made.read_text(encoding="utf-8")).get("overrides", [])
            given = next(o.split("=", 1)[1] for o in overrides if override_key(o) == "heldout.judges")
            recorded = [str(j) for j in yaml.safe_load(given)]
        except (OSError, ValueError, AttributeError, StopIteration, TypeError, yaml.YAMLError):
            continue
        return [j for j in recorded if j in judges] + [j for j in judges if j not in recorded]
    return judges


def _check_same_heldout(source: Path, loaded: dict[str, Any]) -> None:
    """Every arm holds out the same personas and dialogues (:data:`SHARED_HELDOUT`)."""
    first_name, first = next(iter(loaded.items()))
    for arm_name, recipe in loaded.items():
        if recipe.heldout.bank is None:
            raise StudyError(f"{source}: arm {arm_name!r}: heldout.bank is null; a study compares held-out evaluations")
        for key in SHARED_HELDOUT:
            if getattr(recipe.heldout, key) != getattr(first.heldout, key):
                raise StudyError(
                    f"{source}: arm {arm_name!r}: heldout.{key} {getattr(recipe.heldout, key)!r}, arm {first_name!r} "
                    f"{getattr(first.heldout, key)!r}: every arm must be evaluated on the same held-out dialogues"
                )


def _load_arm(source: Path, name: str, overrides: list[str], arm: ArmConfig) -> Any:
    try:
        return load_recipe(arm.recipe, overrides, algorithm=arm.algorithm)
    except (RecipeError, FileNotFoundError) as error:
        raise StudyError(f"{source}: arm {name!r}: {error}") from None


class StudyRunError(RuntimeError):
    """A run of a study failed; the message names it and its log."""


def check_unchanged(study: Study) -> None:
    """Refuse a study whose runs' folders were started with other settings (another
    override or recipe): a study's runs must share theirs, and a finished run is never
    trained again by itself. The judges may change: a run lacking one is resumed to play it.

    Raises:
        StudyError: naming the first runs and what differs.
    """
    changed = []
    for run in study.runs:
        what = run.changed()
        trained, planned = (run.report() or {}).get("steps"), study.steps.get(run.arm)
        if None not in (trained, planned) and trained != planned:  # continued outside the study (its Continue: line)
            what.append(f"its report is at step {trained}, the study trains {planned}")
        if what:
            changed.append((run, what))
    if changed:
        shown = "; ".join(f"{run.name}: {', '.join(what)}" for run, what in changed[:3])
        more = "; ..." if len(changed) > 3 else ""
        raise StudyError(
            f"{len(changed)} runs of this study were started with other settings ({shown}{more}): "
            "give the study another --out, or remove those runs' folders to train them again"
        )


def run_study(
    study: Study, *, jobs: int = 1, share_before: bool = True, say: Callable[[str], None] = print
) -> dict[str, float]:
    """Train every run of ``study`` that has no report yet, ``jobs`` at a time (each child
    with ``OMP_NUM_THREADS`` = cores / jobs unless set), its console output in
    ``<output_dir>/console.log``; returns each run's wall seconds (``{run name: s}``, the
    runs trained now). With ``share_before``, a fresh run starts with the evaluation before
    training of a finished run where the settings match (:func:`copy_before`). Ctrl-C or
    SIGTERM stops the children (each saves a checkpoint) and re-raises; a rerun resumes.

    Raises:
        StudyRunError: a run exited non-zero or wrote no report (the others finish first).
        KeyboardInterrupt: interrupted.
    """
    check_unchanged(study)
    pending = [run for run in study.runs if not study.done(run)]
    judging = sum(run.report() is not None for run in pending)
    say(
        f"{len(study.runs) - len(pending)} of {len(study.runs)} runs already done; {len(pending) - judging} to train"
        + (f"; {judging} to play the judges added since they finished" if judging else "")
    )
    env = dict(os.environ)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    active: dict[Run, tuple[subprocess.Popen, float]] = {}
    times, failed = {}, []
    try:
        while pending or active:
            while pending and len(active) < jobs and not failed:
                run = pending.pop(0)
                active[run] = (_launch(run, study, env, share_before, say), time.monotonic())
            if failed and not active:
                break
            time.sleep(0.5)
            for run, (process, started) in list(active.items()):
                if process.poll() is None:
                    continue
                del active[run]
                times[run.name] = time.monotonic() - started
                if process.returncode != 0 or not study.done(run):
                    log = run.output_dir / "console.log"
                    why = f" ({line})" if (line := _last_line(log)) else ""
                    failed.append(f"{run.name}: exit {process.returncode}{why}; see {log}")
                else:
                    done = len(study.runs) - len(pending) - len(active)
                    say(f"finished {run.name} in {times[run.name]:.0f} s ({done} of {len(study.runs)} runs)")
    except KeyboardInterrupt:
        _stop([process for process, _ in active.values()])
        raise
    if failed:
        raise StudyRunError("; ".join(failed) + "; rerun the same command to resume")
    return times


def _launch(
    run: Run, study: Study, env: dict[str, str], share_before: bool, say: Callable[[str], None]
) -> subprocess.Popen:
    """Start ``run``'s child process (its output to ``console.log``), after recording its
    settings and copying the evaluation before training it lacks from a finished run."""
    command = run.command()  # --resume or not, by what the folder held before any copy
    with folder_lock(run.output_dir) as held:  # not held: a child of an earlier study trains there; ours says so
        shared = copy_before(run, study) if share_before and held else []
        if held:
            write_json(run.output_dir / STUDY_RUN, run.settings)  # the same but for the judges (check_unchanged)
    if shared:
        say(f"{run.name}: the evaluation before training read from a finished run ({', '.join(shared)})")
    with open(run.output_dir / "console.log", "a", encoding="utf-8") as log:
        # its own session: a terminal's Ctrl-C reaches the study alone, which forwards one SIGTERM
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    say(f"started {run.name} ({run.output_dir / 'console.log'})")
    return process


def _last_line(path: Path) -> str:
    """The last line of a run's console log that says something (its error, usually)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").replace("\r", "\n").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")[:300]


def copy_before(run: Run, study: Study) -> list[str]:
    """Copy into a run's ``heldout/`` each file of the evaluation before training that it
    lacks (a fresh run, or a judge added since it started) and that a finished run of the
    study made with the settings this run would make it with, and those settings into its
    ``run.json``: the run reads them back instead of playing them. The policy before its
    first step does not depend on the training seed, the algorithm or the control (LoRA
    starts at zero; the held-out dialogues are seeded by ``heldout.seed``), and the settings
    compared are the held-out evaluation's own
    (:func:`~empathy_gym.agents.heldout.evaluation_settings`). Returns the files copied.
    """
    target = run.output_dir / HELDOUT_DIR
    have = saved_settings(target) or {}
    wanted = {
        name: settings
        for name, settings in study.before.get(run.arm, {}).items()
        if have.get(name) != settings or not (target / name).is_file()
    }
    found: dict[str, Path] = {}
    for donor in study.runs:
        if donor == run or donor.report() is None:
            continue
        folder = donor.output_dir / HELDOUT_DIR
        made = saved_settings(folder) or {}
        for name, settings in wanted.items():
            if name not in found and settings is not None and made.get(name) == settings and (folder / name).is_file():
                found[name] = folder / name
    if found:
        target.mkdir(parents=True, exist_ok=True)
        for name, path in found.items():
            shutil.copyfile(path, target / name)
        write_json(target / RUN_CONFIG, have | {name: wanted[name] for name in found})
    return sorted(found)


def _stop(processes: Sequence[subprocess.Popen]) -> None:
    """SIGTERM to each running child (it finishes its phase, saves a checkpoint and exits);
    another Ctrl-C while they do sends a second (a child then stops at once, keeping its
    last checkpoint), a third kills them."""
    for action in ("terminate", "terminate", "kill"):
        for process in processes:
            if process.poll() is None:
                getattr(process, action)()
        try:
            for process in processes:
                process.wait()
            return
        except KeyboardInterrupt:
            continue


def interval_over_seeds(values: Sequence[float], confidence: float = 0.95) -> dict[str, Any]:
    """The mean of per-seed values with its Student t interval over seeds.

    Args:
        values: one number per training seed.
        confidence: of the interval, in (0, 1).

    Returns:
        ``{"mean", "low", "high", "seeds"}``; ``low`` and ``high`` are ``None`` with fewer
        than two seeds. Formula: mean +- t_{(1+confidence)/2, n-1} * s / sqrt(n)
        (``scipy.stats.t.interval``), s the sample standard deviation.
    """
    import numpy as np
    from scipy import stats

    array = np.asarray(values, dtype=float)
    mean = float(array.mean())
    if len(array) < 2:
        return {"mean": mean, "low": None, "high": None, "seeds": len(array)}
    if np.all(array == array[0]):  # every seed equal: no spread
        return {"mean": mean, "low": mean, "high": mean, "seeds": len(array)}
    low, high = stats.t.interval(confidence, len(array) - 1, loc=mean, scale=stats.sem(array))
    return {"mean": mean, "low": float(low), "high": float(high), "seeds": len(array)}


def judged_difference(report: dict[str, Any], judge: str, training_user: str) -> dict[str, Any] | None:
    """The paired held-out difference that ``judge`` (a spec string) gave in one run's
    ``report.json``: the training user's, the second judge's or one of ``judges``; ``None``
    when it did not judge the run."""
    if judge == training_user:
        return report["difference"]
    if report.get("judge", {}).get("user") == judge:
        return report["judge"]["difference"]
    for other in report.get("judges", ()):
        if other["user"] == judge:
            return other["difference"]
    return None


def _differences(reports: Sequence[dict[str, Any]], column: str, user: str) -> list[float | None]:
    found = [judged_difference(report, column, user) for report in reports]
    return [None if d is None else d["difference"] for d in found]


def _cell(values: Sequence[float | None], confidence: float) -> dict[str, Any] | None:
    return None if not values or any(v is None for v in values) else interval_over_seeds(values, confidence)


def study_table(study: Study, *, confidence: float = 0.95) -> dict[str, Any]:
    """The study's table from its runs' held-out reports (every run must be finished).

    Returns:
        ``{"columns", "users", "seeds", "arms": {arm: {"real", "control", "real_minus_control",
        "capabilities", "monitors"}}, "arm_minus_arm", "text"}``: ``real``/``control``/
        ``real_minus_control`` map each judge column to :func:`interval_over_seeds` of the
        held-out differences (emotion points; ``None`` where a judge did not judge or there
        is no control); ``arm_minus_arm`` maps ``"A - B"`` (each pair of arms, the study's
        order) to the same for A's real runs minus B's, paired by training seed;
        ``capabilities`` each task's change (0-1) over seeds, for ``"real"`` and ``"control"``;
        ``monitors`` the mean of :data:`TABLE_MONITORS` after training over the real runs.

    Raises:
        FileNotFoundError: a run has no report yet.
    """
    reports = {run.name: run.report() for run in study.runs}
    missing = [run.name for run in study.runs if reports[run.name] is None]
    if missing:
        raise FileNotFoundError(f"no held-out report that reads for {', '.join(missing)}; rerun the study to make them")
    arms: dict[str, Any] = {}
    real_by_arm: dict[str, dict[str, list[float | None]]] = {}
    for arm in study.config.arms:
        user = study.users[arm]
        by_kind = {
            kind: [reports[r.name] for r in study.runs if r.arm == arm and r.control == (kind == "control")]
            for kind in ("real", "control")
        }

        row: dict[str, Any] = {"real": {}, "control": {}, "real_minus_control": {}}
        real_by_arm[arm] = {}
        for column in study.columns:
            real, control = (_differences(by_kind[kind], column, user) for kind in ("real", "control"))
            real_by_arm[arm][column] = real
            row["real"][column] = _cell(real, confidence)
            row["control"][column] = _cell(control, confidence)
            paired = [None if a is None or b is None else a - b for a, b in zip(real, control)]
            row["real_minus_control"][column] = _cell(paired, confidence) if control else None
        tasks = by_kind["real"][0].get("capabilities", {})
        row["capabilities"] = {  # the control's too: what training costs without learning from its rewards
            kind: {
                task: _cell([report["capabilities"][task]["difference"] for report in reports], confidence)
                for task in tasks
            }
            for kind, reports in by_kind.items()
            if reports
        }
        row["monitors"] = {
            key: _finite_mean([report["monitors"]["after"][key] for report in by_kind["real"]])
            for key in TABLE_MONITORS
            if all(key in report.get("monitors", {}).get("after", {}) for report in by_kind["real"])
        }
        arms[arm] = row
    result = {"columns": study.columns, "users": study.users, "seeds": study.config.seeds, "arms": arms}
    result["arm_minus_arm"] = _arm_minus_arm(real_by_arm, confidence)
    return result | {"text": table_text(study, result, confidence)}


def _arm_minus_arm(real: dict[str, dict[str, list[float | None]]], confidence: float) -> dict[str, Any]:
    """Each pair of arms (in the study's order), from ``real`` (arm -> judge column -> the real
    runs' held-out differences in seed order): ``{"A - B": {column: cell}}``, each cell
    :func:`interval_over_seeds` of A's difference minus B's, paired by training seed (a seed's
    runs share its draws, so the seed-to-seed spread that both arms share cancels)."""
    names = list(real)
    return {
        f"{first} - {second}": {
            column: _cell(
                [None if x is None or y is None else x - y for x, y in zip(a, real[second][column])], confidence
            )
            for column, a in real[first].items()
        }
        for i, first in enumerate(names)
        for second in names[i + 1 :]
    }


def _finite_mean(values: Sequence[float | None]) -> float | None:
    """The mean, ``None`` where a value is missing or NaN (a monitor with no reply to measure)."""
    if any(v is None or v != v for v in values):
        return None
    return float(sum(values) / len(values))


def _number(cell: dict[str, Any] | None, digits: int = 2) -> str:
    if cell is None:
        return "-"
    if cell["low"] is None:
        return f"{cell['mean']:+.{digits}f}"
    return f"{cell['mean']:+.{digits}f} [{cell['low']:+.{digits}f}, {cell['high']:+.{digits}f}]"


def table_text(study: Study, table: dict[str, Any], confidence: float = 0.95) -> str:
    """:func:`study_table`'s table as plain text (fixed-width columns)."""
    seeds = " ".join(str(s) for s in study.config.seeds)
    lines = [
        f"Study {study.source.stem} ({study.source}): {study.config.description}".rstrip(": "),
        f"Held-out difference (after - before, emotion points, paired by persona) under each judge; mean over "
        f"{_counted(len(study.config.seeds), 'training seed')} ({seeds}) "
        + (
            f"[{confidence:.0%} t interval over seeds]; "
            if len(study.config.seeds) > 1
            else "(one seed: no interval over seeds); "
        )
        + "* the arm's own training user (the diagonal of a judge-by-judge matrix).",
    ]
    width = max(len(c) + 1 for c in study.columns) + 2
    width = max(width, 26)
    left = max(len(arm) for arm in table["arms"]) + len(", real - control") + 2
    header = "arm".ljust(left) + "".join(c.ljust(width) for c in study.columns)
    kinds = [("real", "")] + (
        [("control", " (control)"), ("real_minus_control", ", real - control")] if study.config.control else []
    )
    lines.append(header)
    for kind, label in kinds:
        for arm, row in table["arms"].items():
            cells = [
                (_number(row[kind][c]) + ("*" if c == study.users[arm] else "")).ljust(width) for c in study.columns
            ]
            lines.append(f"{arm}{label}".ljust(left) + "".join(cells))
    if table.get("arm_minus_arm"):
        lines.append(
            "Arm against arm (real runs; the difference of their held-out differences, paired by training seed):"
        )
        for pair, row in table["arm_minus_arm"].items():
            lines.append(pair.ljust(left) + "".join(_number(row[c]).ljust(width) for c in study.columns))
    tasks = sorted({task for row in table["arms"].values() for task in row["capabilities"]["real"]})
    if tasks:
        lines.append("Capabilities (heldout.capabilities; after - before, score 0-1, mean over seeds):")
        for arm, row in table["arms"].items():
            for kind, cells in row["capabilities"].items():
                label = f"{arm}{' (control)' if kind == 'control' else ''}"
                lines.append(f"  {label}: " + "; ".join(f"{t} {_number(cells.get(t), 3)}" for t in tasks))
    lines.append("Monitors after training (held-out replies, shares; mean over the real runs):")
    for arm, row in table["arms"].items():
        monitors = ", ".join(
            f"{key.removeprefix('monitor/')} {'-' if value is None else f'{value:.2f}'}"
            for key, value in row["monitors"].items()
        )
        lines.append(f"  {arm}: {monitors or '-'}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """A study's child process: ``python -m empathy_gym.agents.study ALGORITHM real|control
    TRAINING-ARGS...`` (the training command's arguments)."""
    from empathy_gym.agents import GRPOTrainer, PPOTrainer
    from empathy_gym.agents.cli import train_main
    from empathy_gym.agents.controls import shuffled_reward_trainer

    algorithm, kind, *rest = list(sys.argv[1:] if argv is None else argv)
    trainer = {"grpo": GRPOTrainer, "ppo": PPOTrainer}[algorithm]
    folder = Path(next(arg for arg in reversed(rest) if arg.startswith("output_dir=")).removeprefix("output_dir="))
    with folder_lock(folder) as held:  # a study whose parent was killed leaves its children training
        if not held:
            print(f"error: another process is training in {folder} (a study started earlier?)", file=sys.stderr)
            return 1
        return train_main(
            algorithm,
            rest,
            trainer_class=shuffled_reward_trainer(trainer) if kind == "control" else None,
            command=f"python -m empathy_gym.agents.study {algorithm} {kind}",
        )


if __name__ == "__main__":
    raise SystemExit(main())
