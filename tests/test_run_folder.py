"""The run folder that eval and replay share (empathy_gym.evaluation.run_folder.RunFolder),
and what a folder holds, for every command (one folder holds one run)."""

import json
from pathlib import Path

import pytest

from empathy_gym.evaluation.run_folder import (
    EvaluationError,
    RunFolder,
    check_fresh,
    check_holds_no_other,
    held_runs,
    holds_a_run,
)


def test_a_run_folder_starts_appends_and_resumes(tmp_path):
    folder = RunFolder(tmp_path / "run", {"seed": 0}, "records.jsonl", ("id",))
    assert folder.done == {} and not (tmp_path / "run").exists()  # nothing written before start
    folder.start()
    folder.append([{"id": "a", "x": 1}, {"id": "b", "x": 2}], where=["a", "b"])
    assert json.loads((tmp_path / "run" / "run.json").read_text()) == {"seed": 0}
    with open(tmp_path / "run" / "records.jsonl", "a") as handle:
        handle.write('{"id": "c", "x"')  # a write cut by a crash
    again = RunFolder(tmp_path / "run", {"seed": 0}, "records.jsonl", ("id",))
    assert again.done == {("a",): {"id": "a", "x": 1}, ("b",): {"id": "b", "x": 2}}
    again.append([{"id": "c", "x": 3}], where=["c"])  # on a fresh line: the cut one was removed
    lines = (tmp_path / "run" / "records.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b", "c"]
    assert json.loads(again.write_report({"score": 1}).read_text()) == {"score": 1}


def test_a_run_folder_refuses_another_run_a_file_and_a_corrupt_line(tmp_path):
    first = RunFolder(tmp_path / "run", {"seed": 0}, "records.jsonl", ("id",))
    first.start()
    first.append([{"id": "a"}], where=["a"])
    with pytest.raises(EvaluationError, match=r"run\.json: .*seed: 0 -> 1"):
        RunFolder(tmp_path / "run", {"seed": 1}, "records.jsonl", ("id",))
    (tmp_path / "file").write_text("")
    with pytest.raises(EvaluationError, match="is a file; give a folder"):
        RunFolder(tmp_path / "file", {}, "records.jsonl", ("id",))
    (tmp_path / "run" / "records.jsonl").write_text('{"id": "a"}\n{"x": 1}\n')
    with pytest.raises(EvaluationError, match=r"records\.jsonl:2: field 'id': missing"):
        RunFolder(tmp_path / "run", {"seed": 0}, "records.jsonl", ("id",))


def test_a_run_that_finished_nothing_is_replaced_by_the_corrected_command(tmp_path):
    """A run that failed before its first record (a bad option, a dead server) left a
    run.json that refused the corrected command."""
    RunFolder(tmp_path / "run", {"temperature": -1}, "records.jsonl", ("id",)).start()
    corrected = RunFolder(tmp_path / "run", {"temperature": 0.5}, "records.jsonl", ("id",))
    corrected.start()
    assert json.loads((tmp_path / "run" / "run.json").read_text()) == {"temperature": 0.5}
    corrected.append([{"id": "a"}], where=["a"])
    with pytest.raises(EvaluationError, match=r"temperature: 0\.5 -> -1"):  # now it holds a record
        RunFolder(tmp_path / "run", {"temperature": -1}, "records.jsonl", ("id",))


def test_a_folder_that_cannot_be_created_is_named_as_out_dir(tmp_path):
    """Was: "[Errno 2] No such file or directory: '/proc/nope'", naming no option."""
    (tmp_path / "file").write_text("")
    folder = RunFolder(tmp_path / "file" / "run", {}, "records.jsonl", ("id",))
    with pytest.raises(
        EvaluationError, match=r"out_dir '.*file/run': cannot write there \(\[Errno 20\] Not a directory"
    ):
        folder.start()


def test_a_record_whose_text_holds_a_line_separator_reads_back_as_one(tmp_path):
    """json.dumps(ensure_ascii=False) leaves U+2028 and U+0085 raw; str.splitlines split
    the record in two, and the run folder refused its own file as corrupt."""
    folder = RunFolder(tmp_path / "run", {}, "records.jsonl", ("id",))
    folder.start()
    folder.append([{"id": "a", "reply": "one\u2028two\x85three"}, {"id": "b"}], where=["a", "b"])
    again = RunFolder(tmp_path / "run", {}, "records.jsonl", ("id",))
    assert again.done[("a",)]["reply"] == "one\u2028two\x85three" and list(again.done) == [("a",), ("b",)]


def test_one_folder_holds_one_run_whatever_the_command(tmp_path):
    """Was: a replay whose --out held a finished eval run wrote its own run.json over the
    eval's, so the eval could no longer resume ("holds a run with another configuration");
    an eval into a training run's folder, or a training run into an eval's, mixed their files."""
    from empathy_gym.agents.run_log import RunLog
    from empathy_gym.evaluation.benchmark import evaluate
    from empathy_gym.evaluation.replay import replay_logs

    logs = Path(__file__).parent / "data" / "sage_logs"
    evaluate("baseline:echo", "en", user="rule", limit=1, out_dir=tmp_path / "eval", n_resamples=100)
    saved = (tmp_path / "eval" / "run.json").read_text()
    with pytest.raises(EvaluationError, match=r"eval holds another kind of run: eval \(transcripts\.jsonl\); one fol"):
        replay_logs([logs], "rule", out_dir=tmp_path / "eval")
    assert (tmp_path / "eval" / "run.json").read_text() == saved
    with pytest.raises(FileExistsError, match=r"another kind of run: eval \(transcripts\.jsonl\)"):
        RunLog(tmp_path / "eval", tensorboard=False)  # a fresh training run
    with pytest.raises(FileExistsError, match="another kind of run: eval"):
        check_fresh(tmp_path / "eval")  # the training command's check before any model loads
    assert not (tmp_path / "eval" / "metrics.jsonl").exists()

    training = RunLog(tmp_path / "train", tensorboard=False)
    training.metrics(1, {"reward/mean_return": 0.5})
    training.close()
    with pytest.raises(EvaluationError, match=r"another kind of run: training \(metrics\.jsonl\)"):
        evaluate("baseline:echo", "en", user="rule", limit=1, out_dir=tmp_path / "train", n_resamples=100)
    assert not (tmp_path / "train" / "run.json").exists()
    assert holds_a_run(tmp_path / "train") and not holds_a_run(tmp_path / "eval")

    (tmp_path / "distill" / "features").mkdir(parents=True)
    with pytest.raises(EvaluationError, match=r"another kind of run: distill \(features\)"):
        RunFolder(tmp_path / "distill", {}, "turns.jsonl", ("log",))


def test_what_a_folder_holds(tmp_path):
    assert held_runs(tmp_path / "new") == {} and held_runs(tmp_path) == {}
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "turns.jsonl").write_text('{"log": "a"}\n')
    assert held_runs(tmp_path) == {"training": ["checkpoints"], "replay": ["turns.jsonl"]}
    check_holds_no_other(tmp_path / "new", "eval")
    RunFolder(tmp_path / "other", {}, "records.jsonl", ("id",))  # a records name no kind owns: its own
    with pytest.raises(EvaluationError, match="another kind of run: training"):
        RunFolder(tmp_path, {}, "turns.jsonl", ("log",))


def test_a_run_that_has_finished_nothing_yet_holds_its_folder(tmp_path):
    """Was: until an eval's first dialogue ended, its folder looked empty, and a replay
    started there meanwhile took it (both wrote run.json; neither could resume)."""
    running = RunFolder(tmp_path / "run", {"policy": "slow"}, "transcripts.jsonl", ("persona_id",))
    running.start()
    assert running.done == {} and (tmp_path / "run" / "transcripts.jsonl").read_text() == ""
    with pytest.raises(EvaluationError, match=r"another kind of run: eval \(transcripts\.jsonl\)"):
        RunFolder(tmp_path / "run", {"logs": []}, "turns.jsonl", ("log",))
    late = RunFolder(tmp_path / "late", {}, "turns.jsonl", ("log",))  # opened before the eval started
    RunFolder(tmp_path / "late", {}, "transcripts.jsonl", ("persona_id",)).start()  # its lock goes with it
    with pytest.raises(EvaluationError, match="another kind of run: eval"):
        late.start()
    other = RunFolder(tmp_path / "run", {"policy": "other"}, "transcripts.jsonl", ("persona_id",))
    with pytest.raises(EvaluationError, match=r"another run is running there \(\.lock is held\)"):
        other.start()  # was: it wrote its run.json over the running one's
    assert json.loads((tmp_path / "run" / "run.json").read_text()) == {"policy": "slow"}
    running.close()  # it ended (or failed) having finished nothing
    corrected = RunFolder(tmp_path / "run", {"policy": "fast"}, "transcripts.jsonl", ("persona_id",))
    corrected.start()  # the same kind, nothing finished: the corrected command replaces it
    assert json.loads((tmp_path / "run" / "run.json").read_text()) == {"policy": "fast"}
    corrected.close()


def test_the_folders_of_a_run_are_not_another_runs(tmp_path):
    """Was: `eval --out RUN/heldout` wrote its run.json and report.json over the training
    run's held-out ones, and the resumed run played its evaluation before training again."""
    (tmp_path / "heldout").mkdir()
    (tmp_path / "heldout" / "run.json").write_text("{}")
    for part in ("heldout", "checkpoints", "tb", "transcripts"):
        with pytest.raises(
            EvaluationError, match=rf"{part} is part of the training run in .*; give a folder of its own"
        ):
            RunFolder(tmp_path / part, {"policy": "p"}, "transcripts.jsonl", ("persona_id",))
    RunFolder(tmp_path / "eval", {}, "transcripts.jsonl", ("persona_id",)).start()  # the Continue: line's
    with pytest.raises(EvaluationError, match=r"heldout/x is part of the training run in"):
        RunFolder(tmp_path / "heldout" / "x", {}, "transcripts.jsonl", ("persona_id",))
    assert (tmp_path / "heldout" / "run.json").read_text() == "{}"
    (tmp_path / "d" / "features").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="features is part of the distill run"):
        check_fresh(tmp_path / "d" / "features")


def test_a_training_run_from_python_refuses_another_runs_folder_before_writing(tmp_path):
    """Was: GRPOTrainer(config) wrote heldout/ into an eval's folder before any check, and the
    eval could no longer resume ("holds another kind of run: training (heldout)")."""
    from empathy_gym.agents import TRAINERS
    from empathy_gym.agents.config import load_recipe

    (tmp_path / "transcripts.jsonl").write_text("")
    config = load_recipe("agents/tiny-cpu.yaml", ["heldout.bank=en", f"output_dir={tmp_path}"], algorithm="grpo")
    with pytest.raises(FileExistsError, match="another kind of run: eval"):
        TRAINERS["grpo"](config)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["transcripts.jsonl"]


def test_an_eval_that_has_finished_nothing_is_named_not_read_as_a_sage_log(tmp_path):
    """Was: its empty transcripts.jsonl was read as a SAGE log of a model "transcripts" with
    no dialogue: replay appraised every other turn, then failed with "no dialogues"."""
    from empathy_gym.evaluation.replay import read_logs

    RunFolder(tmp_path / "eval", {"policy": "p"}, "transcripts.jsonl", ("persona_id",)).start()
    logs = Path(__file__).parent / "data" / "sage_logs"
    with pytest.raises(ValueError, match=r"eval/transcripts\.jsonl: no dialogue in it \(a run that has finished none"):
        read_logs([logs, tmp_path / "eval"])
