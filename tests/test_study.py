"""``empathy-gym study``: arms over training seeds with controls, one table, resumable."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from empathy_gym.agents.study import StudyError, interval_over_seeds, judged_difference, load_study
from empathy_gym.cli import app
from empathy_gym.resources import recipes_dir

runner = CliRunner()

TINY = """
description: a tiny smoke study
seeds: [0, 1]
control: true
judges: ["rule,difficulty=challenging"]
overrides: [total_steps=1, rollout_batch_size=4, save_steps=1, progress=false, heldout.bank=en, heldout.repeats=1]
arms:
  grpo: {recipe: tiny-cpu, algorithm: grpo}
  slow: {recipe: tiny-cpu, algorithm: grpo, overrides: [learning_rate=1.0e-6]}
"""


def write(tmp_path, text: str, name: str = "study.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_interval_over_seeds_is_students_t():
    # [1, 3]: mean 2, s = sqrt(2), s / sqrt(2) = 1, t(0.975, 1 df) = 12.7062 (tables)
    cell = interval_over_seeds([1.0, 3.0])
    assert cell["mean"] == 2.0 and cell["seeds"] == 2
    assert cell["low"] == pytest.approx(2 - 12.7062, abs=1e-3) and cell["high"] == pytest.approx(2 + 12.7062, abs=1e-3)
    # [0, 1, 2]: s = 1, s / sqrt(3) = 0.57735, t(0.975, 2 df) = 4.3027
    assert interval_over_seeds([0.0, 1.0, 2.0])["high"] == pytest.approx(1 + 4.3027 * 0.57735, abs=1e-3)
    assert interval_over_seeds([5.0]) == {"mean": 5.0, "low": None, "high": None, "seeds": 1}
    assert interval_over_seeds([2.0, 2.0]) == {"mean": 2.0, "low": 2.0, "high": 2.0, "seeds": 2}


def test_a_judges_difference_is_read_from_where_the_report_keeps_it():
    report = {
        "difference": {"difference": 1.0},
        "judge": {"user": "distilled", "difference": {"difference": 2.0}},
        "judges": [{"user": "rule,difficulty=challenging", "difference": {"difference": 3.0}}],
    }
    assert judged_difference(report, "rule", "rule")["difference"] == 1.0
    assert judged_difference(report, "distilled", "rule")["difference"] == 2.0
    assert judged_difference(report, "rule,difficulty=challenging", "rule")["difference"] == 3.0
    assert judged_difference(report, "rule,difficulty=easy", "rule") is None


def test_a_study_trains_every_arm_seed_and_control_and_tabulates_them(tmp_path):
    out = tmp_path / "out"
    study_file = write(tmp_path, TINY)
    result = runner.invoke(app, ["study", str(study_file), "--out", str(out), "--jobs", "2"])
    assert result.exit_code == 0, result.output
    study = load_study(study_file, out)
    assert len(study.runs) == 8 and all(run.report_path.exists() for run in study.runs)
    assert study.columns == ["rule,difficulty=challenging", "rule"] and study.users == {"grpo": "rule", "slow": "rule"}
    # each run held its own seed and folder, and the control trained with shuffled rewards
    reports = {run.name: json.loads(run.report_path.read_text()) for run in study.runs}
    control_log = (out / "grpo" / "seed-1" / "control" / "train.log").read_text()
    by_name = {run.name: run for run in study.runs}
    assert "seed=1" in " ".join(by_name["grpo/seed-1/control"].overrides)
    assert "trainer: ShuffledRewardsGRPOTrainer" in control_log
    assert [run.name for run in study.runs[:4]] == [  # seed by seed: a study stopped early has every arm
        "grpo/seed-0/real",
        "grpo/seed-0/control",
        "slow/seed-0/real",
        "slow/seed-0/control",
    ]
    assert "ShuffledRewards" not in (out / "grpo" / "seed-1" / "real" / "train.log").read_text()
    # was: a control's closing "Continue:" line resumed it with the real trainer (examples/train_grpo.py)
    for kind in ("real", "control"):
        closing = (out / "grpo" / "seed-1" / kind / "console.log").read_text()
        line = next(line for line in closing.splitlines() if "--resume" in line).split("   (")[0]
        assert shlex.split(line)[:8] == [
            "python",
            "-m",
            "empathy_gym.agents.study",
            "grpo",
            kind,
            "--recipe",
            "tiny-cpu",
            "--resume",
        ]
        assert "heldout.judges=['rule,difficulty=challenging']" in shlex.split(line)  # was: unquoted for a shell
        assert "examples/train_grpo.py" not in closing
    # the table, by hand from the reports: grpo's training user (the diagonal) over seeds 0 and 1
    table = json.loads((out / "study.json").read_text())
    real = [reports[f"grpo/seed-{s}/real"]["difference"]["difference"] for s in (0, 1)]
    control = [reports[f"grpo/seed-{s}/control"]["difference"]["difference"] for s in (0, 1)]
    cell = table["arms"]["grpo"]["real"]["rule"]
    assert cell["mean"] == pytest.approx(sum(real) / 2)
    half = 12.7062 * abs(real[0] - real[1]) / 2  # t(0.975, 1) * s / sqrt(2), s = |a - b| / sqrt(2)
    assert cell["high"] == pytest.approx(cell["mean"] + half, abs=1e-3)
    paired = table["arms"]["grpo"]["real_minus_control"]["rule"]["mean"]
    assert paired == pytest.approx((real[0] - control[0] + real[1] - control[1]) / 2)
    slow = [reports[f"slow/seed-{s}/real"]["difference"]["difference"] for s in (0, 1)]
    against = table["arm_minus_arm"]["grpo - slow"]["rule"]  # paired by seed: (r0 - s0 + r1 - s1) / 2
    assert list(table["arm_minus_arm"]) == ["grpo - slow"] and against["seeds"] == 2
    assert against["mean"] == pytest.approx((real[0] - slow[0] + real[1] - slow[1]) / 2)
    spread = abs((real[0] - slow[0]) - (real[1] - slow[1]))
    assert against["high"] == pytest.approx(against["mean"] + 12.7062 * spread / 2, abs=1e-3)
    challenging = [reports[f"slow/seed-{s}/real"]["judges"][0]["difference"]["difference"] for s in (0, 1)]
    assert table["arms"]["slow"]["real"]["rule,difficulty=challenging"]["mean"] == pytest.approx(sum(challenging) / 2)
    assert set(table["arms"]["grpo"]["monitors"]) >= {"monitor/distinct_2", "monitor/parrot_share"}
    text = (out / "table.txt").read_text()
    assert "Study study" in text and "grpo (control)" in text and "slow, real - control" in text
    assert "\ngrpo - slow " in text and "paired by training seed" in text
    assert f"{cell['mean']:+.2f} [{cell['low']:+.2f}, {cell['high']:+.2f}]*" in text  # the diagonal marked
    assert set(table["seconds"]) == {run.name for run in study.runs}
    # the runs after the first two started with the evaluation before training of a finished run
    assert "grpo/seed-1/real: the evaluation before training read from a finished run" in result.output
    first, later = out / "grpo" / "seed-0" / "real" / "heldout", out / "slow" / "seed-1" / "control" / "heldout"
    for name in ("before.jsonl", "before_judges0.jsonl"):
        assert (later / name).read_bytes() == (first / name).read_bytes()
    assert "read back from" in (out / "slow" / "seed-1" / "control" / "train.log").read_text()

    # a rerun trains nothing and prints the same table; a run whose report is gone is made again
    again = runner.invoke(app, ["study", str(study_file), "--out", str(out)])
    assert again.exit_code == 0 and "8 of 8 runs already done; 0 to train" in again.output
    # was: other settings in the same folder printed the old table as if it were theirs
    changed = runner.invoke(app, ["study", str(study_file), "--out", str(out), "learning_rate=0.5"])
    assert changed.exit_code == 1 and "8 runs of this study were started with other settings" in changed.output
    assert "grpo/seed-0/real: now learning_rate=0.5" in changed.output.replace("\n", "")
    assert (out / "table.txt").read_text() == text
    study.runs[0].report_path.unlink()
    study.runs[1].report_path.write_text('{"before": {"sentient')  # cut short while written
    third = runner.invoke(app, ["study", str(study_file), "--out", str(out)])
    assert third.exit_code == 0 and "6 of 8 runs already done; 2 to train" in third.output
    assert json.loads(study.runs[1].report_path.read_text())["difference"] == reports[study.runs[1].name]["difference"]
    assert "--resume" in study.runs[0].command()


def test_a_judge_added_to_a_finished_study_is_played_alone(tmp_path):
    """Was: a judge added to the study file was refused as other settings; the runs had to
    be removed and trained again to be judged by it."""
    one = TINY.replace("seeds: [0, 1]", "seeds: [0]").replace("control: true", "control: false")
    one = one.replace("  slow: {recipe: tiny-cpu, algorithm: grpo, overrides: [learning_rate=1.0e-6]}\n", "")
    out = tmp_path / "out"
    first = runner.invoke(app, ["study", str(write(tmp_path, one)), "--out", str(out)])
    assert first.exit_code == 0, first.output
    run = out / "grpo" / "seed-0" / "real"
    kept = ["metrics.jsonl", *(f"heldout/{n}_judges0.jsonl" for n in ("before", "after")), "heldout/after.jsonl"]
    made = {name: (run / name).stat().st_mtime_ns for name in kept}
    easy = '"rule,difficulty=easy", "rule,difficulty=challenging"'  # first: the run keeps challenging's index
    more = write(tmp_path, one.replace('"rule,difficulty=challenging"', easy), "more.yaml")
    plan = runner.invoke(app, ["study", str(more), "--out", str(out), "--plan"])
    assert "grpo/seed-0/real (judges to add): " in plan.output
    again = runner.invoke(app, ["study", str(more), "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert "0 of 1 runs already done; 0 to train; 1 to play the judges added since they finished" in again.output
    study = load_study(more, out)
    report = study.runs[0].report()
    assert judged_difference(report, "rule,difficulty=easy", "rule") is not None and study.done(study.runs[0])
    # nothing trained, and what was judged before was read back: the new judge played alone
    assert {name: (run / name).stat().st_mtime_ns for name in kept} == made
    assert (run / "heldout" / "before_judges1.jsonl").exists() and (run / "heldout" / "after_judges1.jsonl").exists()
    assert "rule,difficulty=easy" in (out / "table.txt").read_text()
    # a rerun of either file finds the run done: its report holds every judge of each
    for study_file in (tmp_path / "study.yaml", more):
        assert "1 of 1 runs already done" in runner.invoke(app, ["study", str(study_file), "--out", str(out)]).output
    # was: a run continued outside the study (its Continue: line, total_steps=2) was tabulated beside 1-step runs
    report["steps"] = 2
    study.runs[0].report_path.write_text(json.dumps(report))
    later = runner.invoke(app, ["study", str(more), "--out", str(out)])
    assert later.exit_code == 1 and "its report is at step 2, the study trains 1" in later.output


def test_the_policy_before_training_plays_the_same_dialogues_whatever_the_seed_algorithm_or_control(tmp_path):
    """What sharing the evaluation before training rests on: played anew by each run (no
    sharing), it is the same, byte for byte, across seeds, algorithms and the control."""
    from empathy_gym.agents.study import run_study

    text = TINY.replace(
        "slow: {recipe: tiny-cpu, algorithm: grpo, overrides: [learning_rate=1.0e-6]}",
        "ppo: {recipe: tiny-cpu, algorithm: ppo}",
    )
    study = load_study(write(tmp_path, text), tmp_path / "out")
    run_study(study, share_before=False, say=lambda line: None)
    folders = [run.output_dir / "heldout" for run in study.runs]
    assert len(folders) == 8
    for name in ("before.jsonl", "before_judges0.jsonl"):
        assert len({(folder / name).read_bytes() for folder in folders}) == 1, name
    assert len({(folder / "after.jsonl").read_bytes() for folder in folders}) > 1  # training moved them


def test_a_failed_run_names_itself_and_its_log_and_the_rest_stop(tmp_path):
    broken = TINY.replace("learning_rate=1.0e-6", "policy.model=/nonexistent/model").replace("[0, 1]", "[0]")
    broken = broken.replace("control: true", "control: false")
    out = tmp_path / "out"
    result = runner.invoke(app, ["study", str(write(tmp_path, broken)), "--out", str(out)])
    assert result.exit_code == 1
    assert "slow/seed-0/real: exit 1 (" in result.output and "nonexistent" in result.output
    assert "rerun the same command to resume" in result.output
    assert (out / "grpo" / "seed-0" / "real" / "heldout" / "report.json").exists()  # the run before it is kept


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("seeds: [0, 1]", "seeds: [0, 1]\ncolour: red"), r"study.yaml:4: field 'colour': Key 'colour' not in"),
        (("seeds: [0, 1]", "seeds: [0, 0]"), r"study.yaml:3: field 'seeds': a seed given twice"),
        (("seeds: [0, 1]", "seeds: []"), r"field 'seeds': no training seed"),
        (
            ("control: true", "control: true\ncontrol: false"),
            r"study.yaml:5: .*'control' given twice",
        ),  # was: false won
        (("learning_rate=1.0e-6", "learning_rate=oops"), r"arm 'slow': command-line override 'learning_rate'"),
        (
            (
                "{recipe: tiny-cpu, algorithm: grpo, overrides: [",
                "{recipe: tiny-cpu, algorithm: grpo, overrides: [heldout.split_seed=3, ",
            ),
            r"arm 'slow': heldout.split_seed 3, arm 'grpo' 0: every arm",
        ),
        (("heldout.bank=en, ", ""), r"arm 'grpo': heldout.bank is null"),
        (('judges: ["rule,difficulty=challenging"]', "judges: [gpt:4]"), r"field 'judges\[0\]'"),
        (("recipe: tiny-cpu, algorithm: grpo}", "recipe: nothing-here}"), r"arm 'grpo': no recipe 'nothing-here'"),
        # found by a newcomer's probe: each was a traceback, or passed the check and failed in the run
        (("arms:\n", "arms: [a, b]\nx:\n"), r"study.yaml:\d+: field 'arms'"),
        (("learning_rate=1.0e-6", "seed=7"), r"arms.slow.overrides: 'seed=7': the study sets each run's seed"),
        # was: silently replaced by the study's judges
        (
            ("save_steps=1,", 'save_steps=1, "heldout.judges=[distilled]",'),
            r"'heldout.judges=\[distilled\]': the study sets",
        ),
        (("seeds: [0, 1]", "seeds: [0, -1]"), r"field 'seeds': seed -1 is outside \[0, 2\*\*32 - 1\]"),
        (("  grpo: {", "  ../x: {"), r"field 'arms': arm name '../x'"),
        (('judges: ["rule,difficulty=challenging"]', "judges: [null]"), r"field 'judges\[0\]': null"),
        (("judges: [", 'judges: ["rule,difficulty=impossible", '), r"heldout.judges\[0\]: difficulty 'impossible'"),
    ],
)
def test_a_bad_study_is_refused_before_anything_trains(tmp_path, change, message):
    path = write(tmp_path, TINY.replace(*change))
    with pytest.raises(StudyError, match=message):
        load_study(path, tmp_path / "out")
    result = runner.invoke(app, ["study", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and not (tmp_path / "out").exists()


def test_judges_reach_the_runs_as_written_and_equal_ones_are_one_column(tmp_path):
    """Was: a judge with a quote broke the override (a YAML error), one with a backslash
    reached the run doubled, and two spellings of one judge were played twice."""
    from empathy_gym.agents.config import load_recipe

    judges = ["openai:gpt'4@http://localhost:1/v1", "openai:m\\x@http://h:1/v1", "rule, difficulty=challenging"]
    text = TINY.replace(
        'judges: ["rule,difficulty=challenging"]', f"judges: {json.dumps(judges + ['rule,difficulty=challenging'])}"
    )
    study = load_study(write(tmp_path, text), tmp_path / "out")
    assert study.columns == [judges[0], judges[1], "rule,difficulty=challenging", "rule"]
    run = study.runs[0]
    config = load_recipe(run.recipe, list(run.overrides), algorithm=run.algorithm)
    assert config.heldout.judges == [judges[0], judges[1], "rule,difficulty=challenging"]


def test_bad_seeds_on_the_command_line_are_refused(tmp_path):
    study_file = write(tmp_path, TINY)
    for seeds, message in (("0,0", "a seed given twice"), ("", "expected integers"), ("-3", "outside")):
        result = runner.invoke(
            app, ["study", str(study_file), "--out", str(tmp_path / "o"), "--plan", "--seeds", seeds]
        )
        assert result.exit_code == 1 and message in result.output, (seeds, result.output)


def test_every_shipped_study_loads_and_its_arms_differ_only_in_what_it_varies(tmp_path):
    shipped = sorted((recipes_dir() / "studies").glob("*.yaml"))
    assert {p.stem for p in shipped} >= {
        "ppo-vs-grpo",
        "think",
        "difficulty",
        "ppo-vs-grpo-7b",
        "think-7b",
        "difficulty-7b",
    }
    for path in shipped:
        study = load_study(path.stem, tmp_path)
        assert len(study.runs) == len(study.config.arms) * len(study.config.seeds) * 2, path
        assert len(study.config.seeds) >= 3 and study.config.control, path
    difficulty = load_study("difficulty", tmp_path)
    assert difficulty.users == {
        "easy": "rule,difficulty=easy",
        "moderate": "rule",
        "challenging": "rule,difficulty=challenging",
    }
    assert difficulty.columns == ["rule,difficulty=easy", "rule", "rule,difficulty=challenging", "distilled"]
    served = "openai:Qwen/Qwen2.5-72B-Instruct@http://localhost:8001/v1,max_concurrency=64,difficulty="
    large = load_study("difficulty-7b", tmp_path)  # the LLM user's own difficulty, each arm's training user
    assert large.users == {arm: served + arm for arm in ("easy", "moderate", "challenging")}
    assert large.columns == ["rule,difficulty=challenging", "distilled", *large.users.values()]
    forced = runner.invoke(app, ["study", "think", "--out", str(tmp_path / "t"), "--plan", "--arms", "think-forced"])
    assert forced.exit_code == 0 and "1 arm x 3 seeds x (real, control) = 6 runs" in forced.output
    assert forced.output.count("generation.think=true generation.think_budget=48") == 6
    result = runner.invoke(app, ["study", "difficulty", "--out", str(tmp_path / "d"), "--plan", "--seeds", "4"])
    assert result.exit_code == 0 and "3 arms x 1 seed x (real, control) = 6 runs" in result.output  # was "1 seeds"
    assert "seed=4" in result.output and not (tmp_path / "d").exists()
    # --arms: a subset whose runs are the whole study's (the same commands), so the whole study reads them back
    subset = runner.invoke(
        app, ["study", "difficulty", "--out", str(tmp_path / "d"), "--plan", "--seeds", "4", "--arms", "challenging"]
    )
    assert subset.exit_code == 0 and "1 arm x 1 seed x (real, control) = 2 runs" in subset.output
    whole = [line for line in result.output.splitlines() if line.startswith("challenging/")]
    assert whole and [line for line in subset.output.splitlines() if line.startswith("challenging/")] == whole
    wrong = runner.invoke(app, ["study", "difficulty", "--out", str(tmp_path / "d"), "--plan", "--arms", "hard"])
    assert (
        wrong.exit_code == 1
        and "--arms: no arm 'hard'" in wrong.output
        and "easy, moderate, challenging" in wrong.output
    )
    line = next(line for line in result.output.splitlines() if line.startswith("easy/seed-4/real: "))
    assert line.split(": ", 1)[1].startswith("python -m empathy_gym.agents.study grpo real --recipe smollm2-cpu-grpo")
    assert "'heldout.judges=['\"'\"'rule'\"'\"','\"'\"'rule,difficulty=challenging'\"'\"']'" in line  # shell-quoted


def test_the_matched_ppo_recipe_differs_from_the_quick_start_only_in_the_algorithm(tmp_path):
    from empathy_gym.agents.config import load_recipe, to_dict

    grpo, ppo = to_dict(load_recipe("smollm2-cpu-grpo")), to_dict(load_recipe("smollm2-cpu-ppo-matched"))
    own = {"num_generations", "advantage", "scale_rewards", "epsilon", "epsilon_high", "beta", "loss_type"}
    own |= {"dynamic_sampling_budget", "critic", "critic_learning_rate", "critic_warmup_ratio", "vf_coef"}
    own |= {"cliprange", "cliprange_value", "gamma", "lam", "whiten_advantages", "kl_coef", "output_dir"}
    differ = {key for key in grpo.keys() | ppo.keys() if grpo.get(key) != ppo.get(key)} - own
    assert differ == {"algorithm"}
    assert ppo["cliprange"] == grpo["epsilon"] and ppo["kl_coef"] == grpo["beta"] == 0.0


def _study_process(study_file, out):
    import subprocess
    import sys

    code = "import sys; sys.argv = ['empathy-gym', *sys.argv[1:]]\nfrom empathy_gym.cli import main\nmain()"
    command = [sys.executable, "-c", code, "study", str(study_file), "--out", str(out)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_ctrl_c_stops_the_runs_with_a_checkpoint_and_a_rerun_resumes_them(tmp_path):
    """SIGINT (Ctrl-C) to the study: it forwards one SIGTERM to its running child, which
    finishes its step, saves and exits; the study exits 130; the same command resumes."""
    import signal
    import time

    text = TINY.replace("total_steps=1", "total_steps=40").replace("save_steps=1", "save_steps=100")
    text = text.replace("[0, 1]", "[0]").replace("control: true", "control: false")
    study_file, out = write(tmp_path, text), tmp_path / "out"
    metrics = out / "grpo" / "seed-0" / "real" / "metrics.jsonl"
    process = _study_process(study_file, out)
    deadline = time.monotonic() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "interrupted; the runs saved checkpoints in" in output
    run = out / "grpo" / "seed-0" / "real"
    steps = metrics.read_text().count("\n")
    assert 2 <= steps < 40 and (run / "checkpoints" / f"step-{steps:06d}").is_dir()  # saved at the step it stopped
    assert "finishing the current phase, then saving" in (run / "console.log").read_text()
    again = _study_process(study_file, out)
    output, _ = again.communicate(timeout=300)
    assert again.returncode == 0, output
    assert "0 of 2 runs already done; 2 to train" in output
    assert metrics.read_text().count("\n") == 40 and "resum" in (run / "console.log").read_text().lower()


def test_a_run_already_training_in_its_folder_is_not_started_twice(tmp_path):
    """A study killed with SIGKILL leaves its children training; a rerun must not start a
    second process in the same folder (each child holds a lock on its folder)."""
    import fcntl

    from empathy_gym.agents.study import main

    folder = tmp_path / "run"
    folder.mkdir()
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code = main(["grpo", "real", "--recipe", "tiny-cpu", "total_steps=1", f"output_dir={folder}"])
    assert code == 1 and not (folder / "metrics.jsonl").exists()
    # the study's parent leaves a locked folder alone too (was: rewrote its settings and held-out marks)
    import os

    from empathy_gym.agents.study import _launch

    study = load_study(write(tmp_path, TINY), tmp_path / "out")
    run = study.runs[0]
    run.output_dir.mkdir(parents=True)
    (run.output_dir / "study_run.json").write_text("{}")
    with open(run.output_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert _launch(run, study, dict(os.environ), True, lambda line: None).wait() == 1
    assert (run.output_dir / "study_run.json").read_text() == "{}"
    assert "another process is training in" in (run.output_dir / "console.log").read_text()


def test_a_donor_whose_heldout_run_json_is_not_a_mapping_is_skipped(tmp_path):
    """Was: ``copy_before`` called ``.get`` on a finished run's ``heldout/run.json`` holding a
    list (a hand-edited or foreign file) and the study stopped with an AttributeError."""
    from empathy_gym.agents.study import copy_before

    study = load_study(write(tmp_path, TINY), tmp_path / "out")
    donor, fresh = study.runs[0], study.runs[1]
    (donor.output_dir / "heldout").mkdir(parents=True)
    donor.report_path.write_text(json.dumps({"difference": {"difference": 0.0}}))
    (donor.output_dir / "heldout" / "run.json").write_text("[]")
    assert copy_before(fresh, study) == []
