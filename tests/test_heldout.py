"""The held-out before/after evaluation (:mod:`empathy_gym.agents.heldout`): the split
keeps training and evaluation personas apart, the two evaluations are paired (same
dialogues and sampling seeds: unchanged weights give a difference of exactly 0), the
paired difference and its interval are those worked out by hand, and the report says
what it shows and what it does not."""

import json
import logging
import re
from types import SimpleNamespace

import numpy as np
import pytest

from empathy_gym.agents import load_recipe
from empathy_gym.agents.config import RecipeError
from empathy_gym.agents.heldout import (
    HeldoutEvaluation,
    evaluation_settings,
    feature_shift,
    judges_gap,
    paired_difference,
    prepare,
    report,
)
from empathy_gym.personas import load_personas


def records(finals: dict[str, list[int]]) -> list[dict]:
    return [
        {
            "persona_id": p,
            "repeat": r,
            "final_emotion": e,
            "initial_emotion": 40,
            "turns": 1,
            "termination": "max_turns",
            "hidden_intention": "deep_empathy",
            "character_type": "negative",
        }
        for p, values in finals.items()
        for r, e in enumerate(values)
    ]


def test_paired_difference_by_hand():
    before = records({"a": [40, 50], "b": [30, 30], "c": [40, 40]})
    after = records({"a": [50, 60], "b": [35, 35], "c": [40, 40]})
    # per persona (means over repeats): a 45 -> 55 (+10), b 30 -> 35 (+5), c 40 -> 40 (0)
    result = paired_difference(before, after, n_resamples=2000, seed=0)
    assert result["per_persona"] == {"a": 10.0, "b": 5.0, "c": 0.0}
    assert result["difference"] == pytest.approx(5.0)
    assert result["personas"] == 3
    # resampling 3 values: the mean lies in [0, 10], and the 2.5% / 97.5% quantiles of the
    # bootstrap means of {0, 5, 10} are strictly inside (0 and 10 each need 3 equal draws, p = 1/27)
    assert 0.0 <= result["low"] < 5.0 < result["high"] <= 10.0
    with pytest.raises(ValueError, match="personas"):
        paired_difference(before, records({"a": [1], "b": [2]}))


def test_report_states_the_interval_and_the_caveat():
    before = records({p: [40, 40] for p in "abcdefgh"})
    after = records({p: [50, 45] for p in "abcdefgh"})  # every persona +7.5: interval is the point
    config = load_recipe("agents/tiny-cpu.yaml", ["heldout.bank=en"], algorithm="grpo")
    result = report(config, before, after, steps=3)
    assert result["difference"]["difference"] == pytest.approx(7.5)
    assert result["difference"]["low"] == result["difference"]["high"] == pytest.approx(7.5)
    assert result["excludes_zero"]
    text = result["text"]
    assert "before training" in text and "after 3 steps" in text and "+7.50" in text
    assert "interval excludes 0" in text and "not" in text and "stand-in" in text


@pytest.mark.parametrize(
    ("user", "said"),
    [
        ("rule", "the rule-based stand-in"),
        ("distilled", "a small appraiser distilled from SAGE's LLM simulators"),
        ("openai:qwen@http://127.0.0.1:1/v1", "an LLM playing the user (openai:qwen@http://127.0.0.1:1/v1)"),
    ],
)
def test_the_caveat_names_the_training_user(user, said):
    # Before: a run trained against the distilled user was told "The simulated user here is
    # the rule-based stand-in".
    records_ = records({p: [40] for p in "ab"})
    config = load_recipe("agents/tiny-cpu.yaml", ["heldout.bank=en", f"env.kwargs.user={user}"], algorithm="grpo")
    text = report(config, records_, records_, steps=1)["text"]
    assert f"The simulated user here is {said}" in text
    assert ("stand-in" in text) == (user == "rule")


def test_the_report_says_which_features_moved():
    before = records({"a": [40], "b": [40]})
    after = records({"a": [45], "b": [43]})
    before[0]["steps"] = [{"features": {"echo": -1.0, "mood": 0.5}}, {"features": {"echo": -1.0}}]
    before[1]["steps"] = [{"features": {"echo": 0.0, "step": -1.0}}]
    after[0]["steps"] = [{"features": {"echo": 2.0, "mood": 0.5}}]
    after[1]["steps"] = [{"features": {"echo": 1.0, "step": 1.0, "grounding": 0.5}}]
    # echo: before (-2 + 0) / 2 = -1, after (2 + 1) / 2 = 1.5 -> +2.5; step: -0.5 -> 0.5 (+1);
    # grounding: 0 -> 0.25; mood: 0.25 -> 0.25 (0)
    assert feature_shift(before, after) == {"echo": 2.5, "step": 1.0, "grounding": 0.25, "mood": 0.0}
    config = load_recipe("agents/tiny-cpu.yaml", ["heldout.bank=en"], algorithm="grpo")
    assert "echo +2.50, step +1.00, grounding +0.25, mood +0.00" in report(config, before, after, steps=1)["text"]
    assert feature_shift(records({"a": [40]}), records({"a": [41]})) == {}  # an LLM user: no line
    assert "Where the change came from" not in report(config, records({"a": [40]}), records({"a": [41]}), 1)["text"]


def test_the_evaluation_before_training_is_read_back_only_when_played_with_this_runs_settings(tmp_path, caplog):
    """Was: a run in the folder of a stopped run read back its before.jsonl whatever the
    settings it was played with (another sampling temperature, another model), and compared
    its own policy after training with that one before."""
    overrides = [f"output_dir={tmp_path}", "heldout.bank=en", "heldout.repeats=1", "progress=false"]
    config, held_out = prepare(load_recipe("agents/tiny-cpu.yaml", overrides, algorithm="grpo"))
    folder = tmp_path / "heldout"
    played = [{"persona_id": p.id, "repeat": 0, "final_emotion": 40} for p in held_out]
    (folder / "before.jsonl").write_text("".join(json.dumps(r) + "\n" for r in played))
    assert HeldoutEvaluation(config, progress=False).run("before", None) == played  # no run.json: an older folder
    (folder / "run.json").write_text(json.dumps({"before.jsonl": evaluation_settings(config)}))
    assert HeldoutEvaluation(config, progress=False).run("before", None) == played

    def current(*more, judge=False):
        again = prepare(load_recipe("agents/tiny-cpu.yaml", [*overrides, *more], algorithm="grpo"))[0]
        settings = evaluation_settings(again, "judge" if judge else "dialogues")
        return HeldoutEvaluation(again, progress=False)._current(folder / "before.jsonl", settings)

    # a resume may train longer, report at another confidence, add a second judge or capabilities
    assert current("total_steps=99", "heldout.confidence=0.9", "heldout.user=rule", "heldout.capabilities=[]")
    assert current("generation.engine=vllm", "generation.vllm_gpu_memory_utilization=0.9")  # not the held-out sampler
    with caplog.at_level(logging.WARNING, logger="empathy_gym.agents.heldout"):
        assert not current("generation.temperature=0.5")
    assert "made with other settings (generation.temperature: 1.0 -> 0.5); it is made again" in caplog.text
    assert not current("env.kwargs.max_turns=3") and not current("heldout.repeats=2")
    assert not current(judge=True)  # the judge's file: run.json records none for before.jsonl with a judge

    # an "after" file is read back only when made with these settings at this step: the same checkpoint
    evaluation = HeldoutEvaluation(config, progress=False)
    (folder / "after.jsonl").write_text((folder / "before.jsonl").read_text())
    assert not evaluation._may_read_back("after", folder / "after.jsonl", evaluation_settings(config))  # not marked
    at_step_3 = {**evaluation_settings(config), "step": 3}
    evaluation._mark(folder / "after.jsonl", at_step_3)
    assert evaluation.run("after", SimpleNamespace(step=3)) == played  # read back: nothing is played
    assert not evaluation._may_read_back("after", folder / "after.jsonl", {**at_step_3, "step": 4})
    # a step trained since (a run retrained from step 0 to 3, its checkpoints gone): another policy
    evaluation.on_step_end(SimpleNamespace(step=1), 1, [])
    assert not evaluation._may_read_back("after", folder / "after.jsonl", at_step_3)
    assert evaluation._may_read_back("before", folder / "before.jsonl", evaluation_settings(config))  # kept


def test_before_and_after_are_paired_and_held_out(tmp_path, caplog, capsys):
    from empathy_gym.agents import GRPOTrainer

    config = load_recipe(
        "agents/tiny-cpu.yaml",
        [
            f"output_dir={tmp_path}",
            "progress=false",
            "total_steps=1",
            "rollout_batch_size=4",
            "heldout.bank=en",
            "heldout.repeats=2",
            "heldout.test_fraction=0.2",
            "env.kwargs.max_turns=2",
        ],
        algorithm="grpo",
    )
    given = config
    config, held_out = prepare(config)
    assert config.env.personas == str(tmp_path / "heldout" / "train_personas.jsonl")
    assert given.env.personas is None  # was: rewritten in place, under the caller
    trained_on = {p.id for p in load_personas(config.env.personas)}
    tested = {p.id for p in held_out}
    assert len(tested) == 8 and not trained_on & tested  # round(0.2 * 6) = 1 of each intention
    assert trained_on | tested == {p.id for p in load_personas("en")}
    trainer = GRPOTrainer(config)
    assert {env.dialogue.persona.id if env.dialogue else None for env in trainer.envs} <= trained_on | {None}
    evaluation = HeldoutEvaluation(config, progress=False)
    state = trainer.training_state()
    assert state.session is trainer.session and state.config is trainer.config
    before = evaluation.run("before", state)
    assert len(before) == 16 and {r["persona_id"] for r in before} == tested
    assert (tmp_path / "heldout" / "before.jsonl").exists()
    settings = json.loads((tmp_path / "heldout" / "run.json").read_text())["before.jsonl"]
    assert settings["policy.model"] == "tiny" and settings["heldout.repeats"] == 2 and "total_steps" not in settings
    again = evaluation.run("after", state)  # the same weights: the same dialogues, reply for reply
    assert [r["messages"] for r in again] == [r["messages"] for r in before]
    result = evaluation.finish(before, again, trainer.step)
    assert result["difference"]["difference"] == 0.0 and not result["excludes_zero"]
    saved = json.loads((tmp_path / "heldout" / "report.json").read_text())
    assert saved["difference"]["personas"] == 8
    assert "no clear change" in (tmp_path / "heldout" / "report.txt").read_text()
    capsys.readouterr()
    (tmp_path / "heldout" / "after.jsonl").unlink()  # else read back: made at this step with these settings
    HeldoutEvaluation(config, progress=True).run("after", state)
    bar = capsys.readouterr().err
    assert "held-out evaluation (after)" in bar and "16/16" in bar
    # no time-left estimate: the dialogues play together (it said 33 min after the first one)
    assert not re.search(r"\d:\d\d<", bar)
    caplog.set_level(logging.INFO, logger="empathy_gym.agents.heldout")
    trainer.train()  # from Python, with heldout.bank: the trainer's own evaluations run too
    # its evaluation before training is the file written above, read back: no time estimate from 0 s of play
    assert f"16 dialogues read back from {tmp_path / 'heldout'}" in caplog.text
    assert "takes about as long" not in caplog.text
    assert trainer.heldout_report is not None and trainer.heldout_report["steps"] == 1
    assert json.loads((tmp_path / "heldout" / "report.json").read_text())["steps"] == 1
    after = evaluation.run("after", trainer.training_state())
    # one step at the tiny recipe's learning rate changes replies, not the dialogues' seeds
    assert [r["seed"] for r in after] == [r["seed"] for r in before]
    assert [r["messages"] for r in after] != [r["messages"] for r in before]
    assert np.isfinite(evaluation.finish(before, after, trainer.step)["difference"]["difference"])


def test_the_suggested_evaluations_time_is_bounded_by_the_runs_own_generation_rate(tmp_path):
    from empathy_gym.agents.cli import eval_time_bound

    metrics = tmp_path / "metrics.jsonl"
    # 12 steps: the first two (1000 tokens/s) fall outside the last 10, whose median is 30
    rates = [1000, 1000, 20, 40, 30, 30, 30, 20, 40, 25, 35, 30]
    metrics.write_text(
        "".join(json.dumps({"step": i, "tokens/generated_per_second": r}) + "\n" for i, r in enumerate(rates))
    )
    # 48 English personas x 9 turns x 64 tokens = 27,648 tokens at 30 tokens/s: 921.6 s
    assert eval_time_bound(metrics, 64) == "at most about 15 minutes at this run's 30 generated tokens/s"
    assert eval_time_bound(tmp_path / "none.jsonl", 64).startswith("no estimate of its time")
    # a newcomer's probe: lines that are JSON but no object raised; a fast GPU read "0 minutes"
    metrics.write_text(
        '[1, 2]\nnull\n{"tokens/generated_per_second": true}\n{"tokens/generated_per_second": Infinity}\n'
    )
    assert eval_time_bound(metrics, 64).startswith("no estimate of its time")
    metrics.write_text('{"tokens/generated_per_second": 1' + "0" * 400 + "}\n")  # isfinite overflowed
    assert eval_time_bound(metrics, 64).startswith("no estimate of its time")
    metrics.write_text('{"tokens/generated_per_second": 2000}\n')
    assert eval_time_bound(metrics, 64) == "at most under a minute at this run's 2000 generated tokens/s"
    metrics.write_text('{"tokens/generated_per_second": 460.8}\n')  # 60 s
    assert eval_time_bound(metrics, 64) == "at most about 1 minute at this run's 461 generated tokens/s"


def test_the_training_command_ends_with_the_table_and_where_everything_is(tmp_path, capsys, caplog):
    from empathy_gym.agents.cli import number, train_main

    caplog.set_level(logging.INFO, logger="empathy_gym.agents.heldout")
    out = tmp_path / "run"
    code = train_main(
        "grpo",
        [
            "--recipe",
            "agents/tiny-cpu.yaml",
            f"output_dir={out}",
            "progress=false",
            "total_steps=1",
            "rollout_batch_size=4",
            "num_generations=4",
            "save_steps=0",
            "env.kwargs.max_turns=1",
            "heldout.bank=en",
            "heldout.repeats=1",
            "report_to=tensorboard",
        ],
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "held-out evaluation before training: 16 dialogues" in caplog.text
    assert "difference (paired)" in printed and "What it does not show: empathy" in printed
    # the hint keeps the run's overrides (it dropped output_dir=, and a newcomer's --resume
    # then trained a new run in the recipe's folder)
    continue_line = next(line for line in printed.splitlines() if "--resume" in line)
    assert f"output_dir={out}" in continue_line and "heldout.bank=en" in continue_line
    assert continue_line.count("total_steps=") == 1 and "total_steps=2" in continue_line
    assert continue_line.endswith("(train 1 more step)")  # was "1 more steps"
    for where in (
        "curves.png",
        "metrics.jsonl",
        "tb",
        "episodes.jsonl",
        "checkpoints/",
        "step-000001",
        "heldout/",
        f"empathy-gym eval --policy hf:{out}/checkpoints/step-000001/policy",
        "--max-tokens 64",
        "at this run's",  # the suggested eval's time at most (tiny: under a minute)
        f"empathy-gym capabilities --model tiny --adapter {out}/checkpoints/step-000001/policy --limit 50",
    ):
        assert where in printed, where
    for path in (
        "heldout/before.jsonl",
        "heldout/after.jsonl",
        "heldout/report.json",
        "curves.png",
        "checkpoints/step-000001/policy",
    ):
        assert (out / path).exists(), path
    # small metrics are not printed as 0.0000
    assert number(1.2e-6) == "1.20e-06" and number(0.0) == "0.0000" and number(0.25) == "0.2500"
    # a judge added to the finished run that cannot be built: it stops in the evaluation before
    # training, before the checkpoint loads (was "stopped at step 0" beside a step-1 checkpoint)
    capsys.readouterr()
    argv = ["--recipe", "agents/tiny-cpu.yaml", "--resume", f"output_dir={out}", "progress=false", "total_steps=1"]
    fixed = ["rollout_batch_size=4", "num_generations=4", "save_steps=0", "env.kwargs.max_turns=1"]
    judged = ["heldout.bank=en", "heldout.repeats=1", "heldout.judges=['transformers:/nonexistent']"]
    assert train_main("grpo", [*argv, *fixed, *judged]) == 1
    err = capsys.readouterr().err
    assert "model '/nonexistent': no such file or folder" in err and "stopped at step" not in err
    assert "stopped before training; finished dialogues are in" in err


def test_resume_on_a_folder_without_a_run_is_refused_before_anything_loads(tmp_path, capsys, monkeypatch):
    """It used to log a warning and train from step 0 (after the held-out evaluation)."""
    from empathy_gym.agents import cli

    monkeypatch.setattr(cli, "_train", lambda *args, **kwargs: pytest.fail("a model was loaded"))
    code = cli.train_main("grpo", ["--recipe", "agents/tiny-cpu.yaml", f"output_dir={tmp_path / 'none'}", "--resume"])
    assert code == 1 and "holds no run to continue" in capsys.readouterr().err


def test_a_fresh_run_into_a_previous_runs_folder_is_refused_before_anything_loads(tmp_path, capsys, monkeypatch):
    """It was refused after the policy loaded and the memory plan printed."""
    from empathy_gym.agents import cli

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    monkeypatch.setattr(cli, "_train", lambda *args, **kwargs: pytest.fail("a model was loaded"))
    code = cli.train_main("grpo", ["--recipe", "agents/tiny-cpu.yaml", f"output_dir={tmp_path / 'run'}"])
    assert code == 1 and "already holds a run (metrics.jsonl); pass --resume" in capsys.readouterr().err


def test_the_gap_between_judges_by_hand():
    training = {"difference": 3.0, "low": 1.0, "high": 5.0, "per_persona": {"a": 2.0, "b": 4.0}}
    falling = {"difference": -0.5, "low": -1.0, "high": 0.0, "per_persona": {"a": -1.0, "b": 0.0}}
    gap = judges_gap(training, falling, n_resamples=200)
    assert gap["gap"] == 3.5 and gap["diverge"]  # (2 - -1 + 4 - 0) / 2; rose while the judge fell
    agreeing = judges_gap(training, training, n_resamples=200)
    assert agreeing == {"gap": 0.0, "low": 0.0, "high": 0.0, "confidence": 0.95, "diverge": False}
    unsure = {**training, "low": -1.0}  # the training user's gain is not clear: no warning
    assert not judges_gap(unsure, falling, n_resamples=200)["diverge"]


def _one_step_with_judges(tmp_path, judges: str) -> dict:
    """The held-out report of one GRPO step of the tiny recipe, judged as ``judges`` (an override) says."""
    from empathy_gym.agents import GRPOTrainer

    overrides = [
        f"output_dir={tmp_path}",
        "progress=false",
        "total_steps=1",
        "rollout_batch_size=4",
        "save_steps=0",
        "heldout.bank=en",
        "heldout.repeats=1",
        judges,
        "env.kwargs.max_turns=2",
    ]
    trainer = GRPOTrainer(load_recipe("agents/tiny-cpu.yaml", overrides, algorithm="grpo"))
    trainer.train()
    return trainer.heldout_report


def test_a_second_judge_plays_the_held_out_dialogues_too(tmp_path):
    """The training user again as the second judge: the same dialogues, so the same
    scores and a gap of exactly 0, and no warning."""
    result = _one_step_with_judges(tmp_path, "heldout.user=rule")
    assert (tmp_path / "heldout" / "before_judge.jsonl").exists() and (
        tmp_path / "heldout" / "after_judge.jsonl"
    ).exists()
    assert result["judge"]["user"] == "rule"
    assert result["judge"]["difference"]["difference"] == result["difference"]["difference"]
    assert result["judges_gap"]["gap"] == 0.0 and not result["judges_gap"]["diverge"]
    assert "Second judge (heldout.user = rule" in result["text"] and "WARNING" not in result["text"]
    assert "The held-out replies (reward-hacking monitors" in result["text"]
    assert (
        set(result["monitors"]) == {"before", "after"} and 0 <= result["monitors"]["after"]["monitor/distinct_2"] <= 1
    )
    # during training the same judge re-judged each step's replies: it pays what was paid
    (metrics,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert metrics["judge/change_mean"] == metrics["judge/train_change_mean"] and metrics["judge/gap"] == 0.0
    assert metrics["judge/diverging"] is None  # NaN (written as null) before a window of steps
    assert "During training (metrics.jsonl" in result["text"]
    assert result["training"]["judge/change_mean"] == {
        "first": metrics["judge/change_mean"],
        "last": metrics["judge/change_mean"],
    }
    assert "monitor/reference_nll" not in result["training"]  # full fine-tuning: no reference


def test_more_judges_play_the_same_held_out_personas_before_and_after(tmp_path):
    """``heldout.judges``: each judge plays the held-out personas and seeds before and after
    training in its own files; the training user again as a judge gives the training
    user's numbers exactly, a harder rule user its own."""
    result = _one_step_with_judges(tmp_path, "heldout.judges=[rule,'rule,difficulty=challenging']")
    folder = tmp_path / "heldout"
    for name in ("before_judges0", "after_judges0", "before_judges1", "after_judges1"):
        assert (folder / f"{name}.jsonl").exists(), name
    assert not (folder / "before_judge.jsonl").exists() and "judge" not in result  # no second judge set
    same, harder = result["judges"]
    assert same["user"] == "rule" and harder["user"] == "rule,difficulty=challenging"
    assert same["difference"] == result["difference"] and same["before"] == result["before"]
    assert harder["before"]["sentient_score"] != result["before"]["sentient_score"]
    assert "More judges (heldout.judges" in result["text"] and "  rule,difficulty=challenging" in result["text"]
    saved = json.loads((folder / "run.json").read_text())
    assert saved["before_judges1.jsonl"]["heldout.judges[1]"] == "rule,difficulty=challenging"
    assert "heldout.judges[0]" not in saved["before.jsonl"]  # adding a judge replays nothing else
    assert json.loads((folder / "report.json").read_text())["judges"][1]["user"] == "rule,difficulty=challenging"


def test_a_bad_second_judge_is_refused_before_training():
    with pytest.raises(RecipeError, match=r"heldout.judges\[1\]: .*gpt"):
        load_recipe("agents/tiny-cpu.yaml", ["heldout.bank=en", "heldout.judges=[rule,gpt:4]"], algorithm="grpo")
    with pytest.raises(RecipeError, match=r"heldout.judges needs heldout.bank"):
        load_recipe("agents/tiny-cpu.yaml", ["heldout.bank=null", "heldout.judges=[rule]"], algorithm="grpo")

    with pytest.raises(RecipeError, match="heldout.user: .*gpt"):
        load_recipe("agents/tiny-cpu.yaml", ["heldout.bank=en", "heldout.user=gpt:4"], algorithm="grpo")
    with pytest.raises(RecipeError, match="heldout.user 'policy'"):
        load_recipe("agents/tiny-cpu.yaml", ["heldout.bank=en", "heldout.user=policy"], algorithm="grpo")
    # was: with the evaluation off, a typo in the judge passed until it was turned on
    with pytest.raises(RecipeError, match="heldout.user: .*gpt"):
        load_recipe("agents/tiny-cpu.yaml", ["heldout.bank=null", "heldout.user=gpt:4"], algorithm="grpo")


def test_another_runs_split_is_kept_and_the_new_run_refused(tmp_path):
    """Was: the split was written before the fresh-run check, over another run's (whose
    --resume then trained and evaluated on other personas)."""
    from empathy_gym.agents.heldout import prepare

    def recipe(split_seed):
        overrides = [f"output_dir={tmp_path}", "heldout.bank=en", f"heldout.split_seed={split_seed}"]
        return load_recipe("agents/tiny-cpu.yaml", overrides, algorithm="grpo")

    prepare(recipe(0))
    written = {path.name: path.read_bytes() for path in (tmp_path / "heldout").iterdir()}
    assert sorted(written) == ["test_personas.jsonl", "train_personas.jsonl"]
    prepare(recipe(0))  # the same run again (--resume): the same files, no complaint
    with pytest.raises(FileExistsError, match=r"train_personas.jsonl holds another split .* it is kept"):
        prepare(recipe(1))
    assert {path.name: path.read_bytes() for path in (tmp_path / "heldout").iterdir()} == written
