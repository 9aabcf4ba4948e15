"""The OpenEnv server (``empathy-gym serve``, ``empathy_gym.integrations.openenv``): checked
against openenv-core 0.3.0's own server machinery and client.

openenv-core's server imports fastmcp and its package pulls gradio, which this test
environment does not hold: the checks in ``tests/layered/openenv_checks.py`` run with
pytest in a venv layered on this one (``tests/layered_venv.py``) that has openenv-core
0.3.0. Each starts the real server process on 127.0.0.1 and stops it by PID. The layer is
cached; the test skips only when the layer cannot be built (no package index).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from layered_venv import OPENENV_0_3, run_layered_checks

CHECKS = Path(__file__).resolve().parent / "layered" / "openenv_checks.py"


def test_the_server_against_openenv_core_0_3_0(measured):
    measured(run_layered_checks("openenv-core-0.3.0", OPENENV_0_3, CHECKS, "openenv-core 0.3.0"))


def test_serve_says_what_to_install_without_openenv(tmp_path):
    try:
        import openenv.core  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("openenv-core is importable here; the layered checks cover the module")
    from typer.testing import CliRunner

    from empathy_gym.cli import app

    result = CliRunner().invoke(app, ["serve", "--port", "0"])
    assert result.exit_code == 1
    assert "needs openenv-core 0.3: pip install 'empathy-gym[openenv]'" in result.output


def test_a_bad_serve_variable_is_refused_naming_it(monkeypatch):
    """``serve_app_from_environ`` (the deployment's ``server/app.py``) reads ``serve``'s
    options from ``EMPATHY_GYM_SERVE_*``; a bad value names the variable and the option,
    before anything is built."""
    from empathy_gym.cli import serve_app_from_environ

    monkeypatch.setenv("EMPATHY_GYM_SERVE_MAX_SESSIONS", "0")
    with pytest.raises(
        ValueError, match=r"'--max-sessions' \(env var: 'EMPATHY_GYM_SERVE_MAX_SESSIONS'\).*greater than or equal to 1"
    ):
        serve_app_from_environ()
    monkeypatch.setenv("EMPATHY_GYM_SERVE_MAX_SESSIONS", "4")
    monkeypatch.setenv("EMPATHY_GYM_SERVE_PORT", "http")
    with pytest.raises(ValueError, match=r"'--port' \(env var: 'EMPATHY_GYM_SERVE_PORT'\)"):
        serve_app_from_environ()


def test_serve_refuses_an_env_that_is_not_a_dialogue_env():
    """Before: a TypeError's traceback from deep in the session. Now: exit 1 naming --env."""
    from typer.testing import CliRunner

    from empathy_gym.cli import app

    result = CliRunner().invoke(app, ["serve", "--env", "CartPole-v1", "--port", "0"])
    assert result.exit_code == 1
    assert "--env CartPole-v1: not a dialogue env; the registered ones: EmpathyDialogue-Easy-v0" in result.output


def test_an_empty_token_variable_is_refused_not_an_open_server(monkeypatch):
    """Before: click reads an empty variable as unset, so ``-e EMPATHY_GYM_SERVE_TOKEN=$UNSET``
    started a server that asked no token (found by a probe). Now it is refused, naming it."""
    from empathy_gym.cli import serve_app_from_environ

    monkeypatch.setenv("EMPATHY_GYM_SERVE_TOKEN", "")
    with pytest.raises(ValueError, match=r"EMPATHY_GYM_SERVE_TOKEN: empty \(an unset secret expanded to nothing\?\)"):
        serve_app_from_environ()
