"""Capabilities before and after training (empathy_gym.evaluation.capabilities, issue 40):
the offline tasks' data and scoring, lm-eval's scores against our own greedy decoding, the
paired comparison by hand, and the command."""

from __future__ import annotations

import importlib.util
import json
import random
import re
import time

import pytest
from typer.testing import CliRunner

from empathy_gym.cli import app
from empathy_gym.evaluation import capabilities as cap
from empathy_gym.resources import envs_dir

FOLDER = envs_dir() / "capabilities"
runner = CliRunner()


def task_utils():
    spec = importlib.util.spec_from_file_location("capability_utils", FOLDER / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_math_items_answers_are_their_operands_worked_out():
    rows = [json.loads(line) for line in (FOLDER / "math.jsonl").read_text().splitlines()]
    assert len(rows) == 100 and [row["id"] for row in rows] == list(range(100))
    assert sum(len(row["ops"]) == 1 for row in rows) == 50  # half one step, half two
    for row in rows:
        a, b, c = row["a"], row["b"], row["c"]
        worked = {"+": a + b, "-": a - b, "*": a * b}[row["ops"][0]]
        if len(row["ops"]) == 2:
            worked = {"+": worked + c, "-": worked - c}[row["ops"][1]]
        assert row["answer"] == str(worked) and worked >= 0, row
        assert str(a) in row["question"] and str(b) in row["question"]
    spec = importlib.util.spec_from_file_location("build_math", FOLDER / "build_math.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    assert build.items() == rows  # the committed file is the script's


def test_humaneval_programs_pass_with_the_canonical_solution_and_fail_without():
    utils = task_utils()
    problems = utils.load_humaneval()["test"]
    assert len(problems) == 164
    for doc in list(problems)[:3]:
        assert utils.humaneval_passed(doc, [doc["canonical_solution"]]) == {"pass@1": 1.0}, doc["task_id"]
        assert utils.humaneval_passed(doc, ["    return None\n"]) == {"pass@1": 0.0}, doc["task_id"]


def test_a_program_past_its_limits_fails_and_runs_in_a_folder_of_its_own(tmp_path, monkeypatch):
    utils = task_utils()
    monkeypatch.setattr(utils, "TIMEOUT_S", 2.0)
    assert utils.passes("print('fine')")
    assert not utils.passes("while True:\n    pass")  # time
    assert not utils.passes("x = bytearray(4 * 1024**3)")  # memory
    assert not utils.passes("import os\nassert os.environ.get('HOME') is not None")  # no environment
    monkeypatch.chdir(tmp_path)
    assert utils.passes("open('left_behind.txt', 'w').write('x')")
    assert not (tmp_path / "left_behind.txt").exists()
    # a program that ends before its tests ran (was: a pass)
    assert not utils.passes("import sys\nsys.exit(0)\nassert False")
    assert not utils.passes("import os\nos._exit(0)")
    assert not utils.passes("while True:\n    print('x' * 1000)")  # output past its limit (was: held in memory)
    marker = tmp_path / "child_lived_on"
    started = time.monotonic()  # a child that holds the output open: was a 10 s wait and a fail
    assert utils.passes(
        f"import os, subprocess, time\nif os.fork() == 0:\n    time.sleep(1)\n    open({str(marker)!r}, 'w')"
    )
    assert utils.passes("import subprocess\nsubprocess.Popen(['sleep', '30'])") and time.monotonic() - started < 1.5
    time.sleep(1.5)
    assert not marker.exists()  # what the program started is killed with it


@pytest.mark.parametrize(
    "low,high,expected",
    [
        (-0.10, -0.01, "lost"),
        (-0.04, 0.10, "kept"),
        (-0.05, 0.0, "kept"),
        (-0.20, 0.10, "not clear"),
        (0.0, 0.0, "kept"),
    ],
)
def test_the_verdict_follows_the_interval(low, high, expected):
    assert cap.verdict(low, high, margin=0.05) == expected


def test_the_paired_comparison_by_hand():
    before = {"t": {0: 1.0, 1: 1.0, 2: 0.0, 3: 0.0, 9: 1.0}}
    after = {"t": {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}}  # item 9 was not scored after: left out
    row = cap.compare(before, after, n_resamples=2000)["t"]
    assert (row["items"], row["before"], row["after"], row["difference"]) == (4, 0.5, 0.25, -0.25)
    # resamples of [0, -1, 0, 0]: means from -1 to 0 in quarters; the interval holds the mean
    assert -1.0 <= row["low"] <= -0.25 <= row["high"] <= 0.0 and row["verdict"] == "not clear"
    same = cap.compare(before, before)["t"]
    assert (same["difference"], same["low"], same["high"], same["verdict"]) == (0.0, 0.0, 0.0, "kept")
    floor = cap.compare({"z": {0: 0.0, 1: 0.0}}, {"z": {0: 0.0, 1: 0.0}})
    assert floor["z"]["verdict"] == "at floor" and "at floor" in cap.table_text(floor)  # was "kept"
    assert cap.compare({"z": {0: 1.0}}, {"z": {0: 1.0}})["z"]["verdict"] == "at ceiling"
    with pytest.raises(ValueError, match="task 't': no item scored both"):
        cap.compare(before, {"t": {5: 1.0}})


def last_integer(text: str) -> str | None:
    found = re.findall(r"-?[0-9]+", text)
    return found[-1] if found else None


@pytest.mark.slow
def test_lm_eval_scores_the_math_task_as_our_own_greedy_decoding_does():
    """lm-eval's prompt, stop strings, filter and metric, checked against a greedy
    ``generate`` of the same prompt scored by hand."""
    import torch

    from empathy_gym.backends.models import load_causal_lm

    model, tokenizer = load_causal_lm("smollm2")
    scores = cap.measure(model, tokenizer, ["empathy_math"], limit=8, batch_size=4)["empathy_math"]
    rows = [json.loads(line) for line in (FOLDER / "math.jsonl").read_text().splitlines()][:8]
    ours = {}
    for row in rows:
        prompt = tokenizer(f"Question: {row['question']}\nAnswer:", return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**prompt, max_new_tokens=48, do_sample=False, pad_token_id=tokenizer.eos_token_id)
        text = tokenizer.decode(ids[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
        text = re.split(r"\n\n|Question:", text)[0]
        ours[row["id"]] = float(last_integer(text) == row["answer"])
    assert scores == ours
    assert 0 < sum(scores.values()) < 8  # neither floor nor ceiling for a 135M model


def test_the_command_compares_a_model_with_its_adapter(tmp_path):
    """A LoRA adapter as peft initialises it (B = 0) changes nothing: the same greedy
    replies, a difference of 0 (the tiny random model scores 0: "at floor"); its
    report.json holds every item's score."""
    from peft import LoraConfig, get_peft_model

    from empathy_gym.backends.models import load_causal_lm

    model, _ = load_causal_lm("tiny")
    get_peft_model(model, LoraConfig(r=2, target_modules="all-linear")).save_pretrained(tmp_path / "policy")
    args = ["capabilities", "--model", "tiny", "--adapter", str(tmp_path / "policy"), "--tasks", "empathy_math"]
    result = runner.invoke(app, [*args, "--limit", "3", "--batch-size", "3", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert re.search(
        r"empathy_math\s+3\s+0\.000\s+0\.000\s+\+0\.000\s+\[\+0\.000, \+0\.000\]\s+at floor", result.output
    )
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["table"]["empathy_math"]["verdict"] == "at floor" and report["before"] == report["after"]
    assert sorted(report["before"]["empathy_math"]) == ["0", "1", "2"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tasks", "no_such_task"], "lm-eval knows no task ['no_such_task']"),
        (["--adapter", "/nonexistent/policy"], "--adapter /nonexistent/policy: not a folder"),
        (["--tasks", " , "], "--tasks: no task named"),
        (["--adapter", "{empty}"], "holds neither LoRA adapters (adapter_config.json) nor a model (config.json)"),
        (["--out", "{file}"], "cannot write there"),  # was: a traceback after the whole run
        (["--out", "{eval_run}"], "holds another kind of run: eval (transcripts.jsonl)"),  # was: its report replaced
        (["--adapter", "{other_vocabulary}"], "tokens in its vocabulary; tiny has"),  # was: IndexError mid-run
    ],
)
def test_bad_input_is_one_line_naming_it(args, message, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "eval_run").mkdir()
    (tmp_path / "eval_run" / "transcripts.jsonl").write_text("")
    if "{other_vocabulary}" in args:
        from empathy_gym.backends.models import load_causal_lm

        model, tokenizer = load_causal_lm("tiny")
        model.resize_token_embeddings(1000)
        model.save_pretrained(tmp_path / "other_vocabulary")
        tokenizer.save_pretrained(tmp_path / "other_vocabulary")
    args = [
        arg.format(
            empty=tmp_path / "empty",
            file=tmp_path / "file",
            other_vocabulary=tmp_path / "other_vocabulary",
            eval_run=tmp_path / "eval_run",
        )
        for arg in args
    ]
    result = runner.invoke(app, ["capabilities", "--model", "tiny", "--limit", "1", *args])
    assert result.exit_code == 1 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_the_offline_tasks_ship_in_the_wheels_data_folder():
    assert {path.name for path in FOLDER.iterdir()} >= {
        "empathy_math.yaml",
        "empathy_humaneval.yaml",
        "utils.py",
        "math.jsonl",
        "build_math.py",
    }


def test_the_held_out_report_measures_capabilities_before_and_after_training(tmp_path):
    """``heldout.capabilities``: lm-eval's tasks on the policy itself before the first step
    and after the last, their items' scores kept, the paired table in the report."""
    from empathy_gym.agents import GRPOTrainer, load_recipe

    overrides = [
        f"output_dir={tmp_path}",
        "progress=false",
        "total_steps=1",
        "rollout_batch_size=4",
        "env.kwargs.max_turns=2",
        "heldout.bank=en",
        "heldout.repeats=1",
        "heldout.capabilities=[empathy_math]",
        "heldout.capabilities_limit=3",
    ]
    trainer = GRPOTrainer(load_recipe("agents/tiny-cpu.yaml", overrides, algorithm="grpo"))
    trainer.train()
    table = trainer.heldout_report["capabilities"]["empathy_math"]
    assert table["items"] == 3 and table["verdict"] in ("kept", "lost", "not clear", "at floor")
    before = json.loads((tmp_path / "heldout" / "capabilities_before.json").read_text())
    after = json.loads((tmp_path / "heldout" / "capabilities_after.json").read_text())
    assert sorted(before["empathy_math"]) == sorted(after["empathy_math"]) == ["0", "1", "2"]
    assert table["before"] == sum(before["empathy_math"].values()) / 3
    text = (tmp_path / "heldout" / "report.txt").read_text()
    assert "Capabilities (lm-eval, greedy, the same items before and after" in text and "empathy_math" in text
    trainer.model.train()
    evaluation = next(c for c in trainer.callbacks if getattr(c, "report", None) is not None)
    assert evaluation.capabilities("after", trainer.training_state()) == {
        task: {int(i): v for i, v in items.items()} for task, items in after.items()
    }  # greedy: the same scores again
    assert trainer.model.training  # measuring left the policy in training mode


@pytest.mark.parametrize(
    "override,message",
    [
        ("heldout.capabilities_limit=0", "heldout.capabilities_limit must be >= 1 or null, got 0"),
        ("heldout.capabilities_margin=2", "heldout.capabilities_margin must be in [0, 1], got 2"),
        ("heldout.capabilities=[nosuch]", "heldout.capabilities: lm-eval knows no task ['nosuch']"),  # was: mid-run
        ("heldout.bank=null", "heldout.capabilities needs heldout.bank"),  # was: silently ignored
    ],
)
def test_bad_capability_settings_are_refused_when_the_recipe_loads(override, message):
    from empathy_gym.agents import RecipeError, load_recipe

    base = ["heldout.bank=en", "heldout.capabilities=[empathy_math]"]
    with pytest.raises(RecipeError, match=re.escape(message)):
        load_recipe("agents/tiny-cpu.yaml", [*base, override], algorithm="grpo")


def test_measuring_leaves_the_global_rngs_as_they_were():
    """lm-eval seeds Python's, NumPy's and torch's global RNGs; a run that measures before
    its first step would otherwise draw other numbers than the same run without it."""
    import numpy as np
    import torch

    from empathy_gym.backends.models import load_causal_lm

    model, tokenizer = load_causal_lm("tiny")
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    cap.measure(model, tokenizer, ["empathy_math"], limit=1)
    after = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    assert after == (random.random(), float(np.random.rand()), float(torch.rand(1)))


def test_capability_scores_are_measured_again_when_made_with_other_settings(tmp_path):
    """Was: run.json said nothing per file, so a resumed run with other capability settings
    read back the old scores (and failed at the end: no item in common)."""
    from empathy_gym.agents import load_recipe
    from empathy_gym.agents.heldout import HeldoutEvaluation, evaluation_settings, prepare

    base = [f"output_dir={tmp_path}", "heldout.bank=en", "heldout.capabilities=[empathy_math]"]

    def evaluation(*more):
        config = prepare(load_recipe("agents/tiny-cpu.yaml", [*base, *more], algorithm="grpo"))[0]
        return HeldoutEvaluation(config, progress=False), evaluation_settings(config, "capabilities")

    first, settings = evaluation("heldout.capabilities_limit=3")
    path = tmp_path / "heldout" / "capabilities_before.json"
    path.write_text(json.dumps({"empathy_math": {"0": 1.0, "1": 0.0, "2": 1.0}}))
    first._mark(path, settings)
    assert first.capabilities("before", None) == {"empathy_math": {0: 1.0, 1: 0.0, 2: 1.0}}  # read back
    again, other = evaluation("heldout.capabilities_limit=5")
    assert not again._current(path, other)
    assert evaluation("heldout.capabilities_limit=3", "heldout.capabilities_margin=0.2", "heldout.confidence=0.9")[
        0
    ]._current(path, settings)  # the report's settings only
    dialogues = json.loads((tmp_path / "heldout" / "run.json").read_text())
    assert list(dialogues) == ["capabilities_before.json"]
