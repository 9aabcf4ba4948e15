"""Busy cores noticed (issue 37): the quick start's steps went from 9-16 s to 97-250 s
beside other work, and nothing at run time said why or what to set."""

from __future__ import annotations

import logging

from empathy_gym.cpu_load import SlowStepWatch, busy_cores_warning


def test_busy_cores_are_named_with_what_to_set():
    # two cores, one other running thread, torch's 2 threads: 3 > 2
    warning = busy_cores_warning(2, cores=2, others=1, env={})
    assert warning is not None
    assert "(1 other thread running on the 2 this process may use)" in warning and "OMP_NUM_THREADS=1" in warning
    assert busy_cores_warning(2, cores=2, others=0, env={}) is None  # idle
    assert busy_cores_warning(1, cores=2, others=1, env={}) is None  # one thread beside one job fits
    assert busy_cores_warning(2, cores=2, others=3, env={"OMP_NUM_THREADS": "2"}) is None  # the user chose


def test_others_running_reads_a_count_of_threads():
    from empathy_gym.cpu_load import others_running

    assert others_running() >= 0


def test_a_step_three_times_slower_than_the_first_steps_is_said_once():
    watch = SlowStepWatch(env={})
    # the first step (building) left out; the reference is the median of steps 2-4: 10 s
    said = [watch.add(t) for t in (60.0, 9.0, 10.0, 12.0, 25.0, 31.0, 40.0)]
    assert said[:5] == [None] * 5  # 25 s is 2.5 times: not yet
    assert said[5] == (
        "step 6 took 31 s, 3.1 times the first steps' 10 s: other work may be using the cores; "
        "export OMP_NUM_THREADS=1 (or the cores left free) before the command"
    )
    assert said[6] is None  # once
    resumed = SlowStepWatch(env={})  # a resumed run names the training step
    assert [resumed.add(t, step) for t, step in zip((60.0, 9.0, 10.0, 12.0), range(21, 25))] == [None] * 4
    assert resumed.add(40.0, 25).startswith("step 25 took 40 s, 4.0 times")
    chosen = SlowStepWatch(env={"OMP_NUM_THREADS": "1"})
    assert all(chosen.add(t) is None for t in (60.0, 9.0, 10.0, 12.0, 100.0))


def test_the_trainer_says_it_in_the_log(monkeypatch, caplog, tmp_path):
    import empathy_gym.agents.trainer as trainer_module
    from empathy_gym.agents import TRAINERS, load_recipe

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(trainer_module, "busy_cores_warning", lambda threads: f"busy: {threads} threads")
    overrides = ["rollout_batch_size=4", "generation.max_new_tokens=6", "total_steps=1", "save_steps=0"]
    config = load_recipe(
        "agents/tiny-cpu.yaml",
        [f"output_dir={tmp_path}", "progress=false", "report_to=none", *overrides],
        algorithm="grpo",
    )
    with caplog.at_level(logging.WARNING, logger="empathy_gym.agents.trainer"):
        TRAINERS["grpo"](config).train()
    assert any(record.getMessage().startswith("busy: ") for record in caplog.records)
