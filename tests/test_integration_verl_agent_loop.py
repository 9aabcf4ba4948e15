"""The verl agent loop (verl >= 0.8): checked against verl 0.9.1's own classes.

verl pins transformers < 5.11 and pulls ray, so it does not install into this test
environment. The checks in ``tests/layered/verl_agent_loop_checks.py`` run with pytest in
a venv layered on this one (``tests/layered_venv.py``): pip installs verl 0.9.1 without
its dependencies, then the dependencies that the agent loop's modules import, resolved
against what is already here (ray, tensordict, hydra-core, omegaconf 2.3, transformers
5.10, ...). The layer is cached; the first build takes about a minute and a half on two
busy cores. The test skips only when the layer cannot be built (no package index).

The tests below the first need no verl.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from layered_venv import VERL_0_9, run_layered_checks

from empathy_gym.integrations import verl as ev

REPO = Path(__file__).resolve().parent.parent
CHECKS = REPO / "tests" / "layered" / "verl_agent_loop_checks.py"
FOLDER = REPO / "agents" / "verl"


def test_agent_loop_against_verl_0_9_1(measured):
    measured(run_layered_checks("verl-0.9.1", VERL_0_9, CHECKS, "verl 0.9.1"))


# -- without verl ------------------------------------------------------------------------------
def test_the_agent_loop_module_says_what_to_install_without_verl():
    try:
        import verl.experimental.agent_loop  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("verl is importable here; the layered checks cover the module")
    with pytest.raises(ImportError, match=r"verl >= 0\.8.*pip install 'verl>=0\.8'"):
        import empathy_gym.integrations.verl_agent_loop  # noqa: F401


RLVER_SETTINGS = {  # DESIGN.md section 1 (RLVER's training facts)
    "data.train_batch_size": 32,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "critic.optim.lr": 5e-6,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "algorithm.use_kl_in_reward": False,
    "actor_rollout_ref.actor.entropy_coeff": 0.001,
    "actor_rollout_ref.actor.clip_ratio": 0.2,
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "actor_rollout_ref.rollout.temperature": 1.0,
}


def test_training_configs_carry_rlver_settings():
    from omegaconf import OmegaConf

    common = OmegaConf.load(FOLDER / "rlver_common.yaml")
    for key, value in RLVER_SETTINGS.items():
        assert OmegaConf.select(common, key) == value, key
    assert OmegaConf.select(common, "algorithm.adv_estimator") == "gae"
    assert OmegaConf.select(common, "actor_rollout_ref.rollout.n") == 1
    assert OmegaConf.select(common, "trainer.use_v1") is True  # reads the per-turn rm_scores
    grpo = OmegaConf.load(FOLDER / "rlver_grpo.yaml")
    assert OmegaConf.select(grpo, "algorithm.adv_estimator") == "grpo"
    assert OmegaConf.select(grpo, "actor_rollout_ref.rollout.n") == 4


def test_shipped_agent_loop_entries_and_the_cli_builds_rows_from_them(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    path = FOLDER / "agent_loop.yaml"
    server = ev.load_agent_loop_config(path)  # the first EmpathyAgentLoop entry
    assert server == ev.load_agent_loop_config(path, "empathy_dialogue")
    assert server["user"]["backend"] == "openai" and server["protocol"] == "rlver_training"
    assert server["max_turns"] == 9 and server["env_id"] == "EmpathyDialogue-RLVER-v0"
    local = ev.load_agent_loop_config(path, "empathy_dialogue_inprocess")
    assert local["user"] == "rule" and "base_url" not in local
    with pytest.raises(KeyError, match="'nobody'"):
        ev.load_agent_loop_config(path, "nobody")

    ev.main(
        [
            "prepare",
            "--config",
            str(path),
            "--name",
            "empathy_dialogue_inprocess",
            "--out",
            str(tmp_path),
            "--val-size",
            "0",
            "--personas",
            "en",
        ]
    )
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    ids = [row["extra_info"]["persona_id"] for row in rows]
    assert len(rows) == 48
    assert rows == ev.build_rows({**local, "personas": "en"}, persona_ids=ids, seed=0)
    assert rows[0]["extra_info"]["interaction_kwargs"]["name"] == ev.DEFAULT_NAME
