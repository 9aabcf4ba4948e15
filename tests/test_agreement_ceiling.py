"""Tests of benchmarks/agreement_ceiling.py on the log slices (tests/data/sage_logs: the
first three dialogues of each of SAGE's seven logs, the same three profiles in each).

The expected values are read off the slices by hand: the logged change of each
profile's first scored reply, per log file (simulator / tested model):

    profile    Gemini o1 | GPT-4o: claude3.7 claude3.7-think deepseek gpt-4o llama o1
    d3c386e4       +5    |           -5          -5            -5       +5     +5   +5
    66aaf749      +10    |           +5         +10            +5       +5    +10  -10
    cf31b2b2       +5    |           -5          -5            -5       -5     -5   +5
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from script_modules import ROOT, load_script

from empathy_gym.evaluation.replay import agreement

SAGE_LOGS = Path(__file__).parent / "data" / "sage_logs"
GPT, GEMINI = "gpt-4o-2024-0806", "gemini-2.5-flash-nothink"


def _module(name: str):
    return load_script(ROOT / "benchmarks" / f"{name}.py")


@pytest.fixture(scope="module")
def ceiling():
    return _module("agreement_ceiling")


@pytest.fixture(scope="module")
def rows(ceiling):
    return ceiling.read_rows(SAGE_LOGS)


def test_first_replies_are_the_first_scored_reply_of_each_log(ceiling, rows):
    first = ceiling.first_replies(rows)
    assert sorted(profile[:8] for profile in first) == ["66aaf749", "cf31b2b2", "d3c386e4"]
    changes = {
        profile[:8]: {model: int(rows.change[i]) for (sim, model), i in found.items() if sim == GPT}
        for profile, found in first.items()
    }
    assert changes["66aaf749"] == {
        "claude3.7": 5,
        "claude3.7-think": 10,
        "deepseek-v3-1227": 5,
        "gpt-4o-0806": 5,
        "llama3.3-70b": 10,
        "openai-o1": -10,
    }
    assert {profile[:8]: int(rows.change[found[(GEMINI, "openai-o1")]]) for profile, found in first.items()} == {
        "d3c386e4": 5,
        "66aaf749": 10,
        "cf31b2b2": 5,
    }
    assert all(rows.requests[i].turn == 1 for found in first.values() for i in found.values())


def test_judge_pairs_agree_as_counted_by_hand(ceiling, rows):
    pairs = ceiling.judge_pairs(rows)
    sign = {
        name: agreement(rows.change[left], rows.change[right]).sign_agreement for name, (left, right) in pairs.items()
    }
    # same judge: 15 pairs of models per profile; equal signs: 3+3 of d3c386e4's (three -,
    # three +), 10 of 66aaf749's (five +, one -), 10 of cf31b2b2's (five -, one +)
    assert len(pairs["same_judge"][0]) == 45
    assert sign["same_judge"] == pytest.approx(26 / 45)
    # o1 under both judges: +5/+5, -10/+10, +5/+5
    assert sign["o1_two_judges"] == pytest.approx(2 / 3)
    # every GPT-4o-judged reply against Gemini's o1 (+ for all three): 3 + 5 + 1 of 18
    assert len(pairs["any_two_judges"][0]) == 18
    assert sign["any_two_judges"] == pytest.approx(9 / 18)


def test_a_first_reply_with_another_opening_is_left_out(ceiling, rows):
    first = ceiling.first_replies(rows)
    profile = next(iter(first))
    moved = first[profile][(GPT, "claude3.7")]
    request = rows.requests[moved]
    changed = dataclasses.replace(
        rows,
        requests=[
            dataclasses.replace(request, history=(("user", "another opening line"),)) if i == moved else r
            for i, r in enumerate(rows.requests)
        ],
    )
    assert (GPT, "claude3.7") not in ceiling.first_replies(changed)[profile]
    assert len(ceiling.first_replies(changed)[profile]) == len(first[profile]) - 1


def test_the_learners_fit_one_family_and_score_the_other(ceiling, rows):
    pytest.importorskip("sklearn")
    gpt, gem = rows.simulator == GPT, rows.simulator == GEMINI
    for learner in ("logistic", "ridge"):
        values = ceiling.ngram_learner(rows, gpt, gem, learner=learner, reply=True, named=True, last_user=True, C=0.3)
        assert values.shape == (int(gem.sum()),) and np.all(np.isfinite(values))
        assert np.ptp(values) > 0
        again = ceiling.ngram_learner(rows, gpt, gem, learner=learner, reply=True, named=True, last_user=True, C=0.3)
        assert np.array_equal(values, again)
    # the learner sees the training labels: on its own rows it beats the majority sign
    values = ceiling.ngram_learner(rows, gpt, gpt, learner="logistic", reply=True, named=False, last_user=False, C=10.0)
    signs = np.sign(rows.change[gpt])
    assert np.mean(np.sign(values) == signs) > max(np.mean(signs > 0), np.mean(signs < 0)) + 0.1


def test_the_script_writes_its_table(ceiling, tmp_path):
    pytest.importorskip("sklearn")
    out = tmp_path / "ceiling.txt"
    ceiling.main(["--logs", str(SAGE_LOGS), "--out", str(out)])
    text = out.read_text(encoding="utf-8")
    assert "GPT-4o vs Gemini: two samples of o1's reply" in text
    assert "by the reply's turn" in text and "Gemini -> GPT-4o" in text
    line = next(line for line in text.splitlines() if line.startswith("GPT-4o vs Gemini: two samples"))
    assert line.split()[-7:-5] == ["3", f"{2 / 3:.3f}"]


@pytest.mark.parametrize("script", ["agreement_ceiling", "fit_rule_model"])
def test_both_scripts_refuse_a_negative_negative_weight(script, capsys):
    module = _module(script)
    with pytest.raises(SystemExit):
        module.main(["--logs", str(SAGE_LOGS), "--negative-weight", "-1", "--no-write"])
    assert "--negative-weight: must be >= 0, got -1.0" in capsys.readouterr().err
