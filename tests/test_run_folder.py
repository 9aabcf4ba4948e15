"""The run folder that eval and replay share (empathy_gym.evaluation.run_folder.RunFolder)."""

import json

import pytest

from empathy_gym.evaluation.run_folder import EvaluationError, RunFolder


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
