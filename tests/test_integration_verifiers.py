"""The verifiers environment (``empathy_gym.integrations.verifiers``, taskset id
``empathy-dialogue``): checked against verifiers 0.4.0's own machinery.

verifiers pins openai < 3, so it does not install into this test environment. The checks
in ``tests/layered/verifiers_checks.py`` run with pytest in a venv layered on this one
(``tests/layered_venv.py``) that has verifiers 0.4.0 and uv: whole episodes through
verifiers' env lifecycle, interception server, ``null`` chat harness (a program that
verifiers prepares with ``uv``, which fetches its few dependencies from the package index
once) and ``vf-eval``, against a stub OpenAI-compatible endpoint. The layer is cached; the
first build takes about two minutes on two busy cores. The test skips only when the layer
cannot be built (no package index).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from layered_venv import VERIFIERS_0_4, run_layered_checks

CHECKS = Path(__file__).resolve().parent / "layered" / "verifiers_checks.py"


def test_environment_against_verifiers_0_4_0(measured):
    measured(run_layered_checks("verifiers-0.4.0", VERIFIERS_0_4, CHECKS, "verifiers 0.4.0"))


def test_the_modules_say_what_to_install_without_verifiers():
    try:
        import verifiers.v1  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("verifiers is importable here; the layered checks cover the modules")
    for module in ("empathy_gym.integrations.verifiers", "empathy_dialogue"):
        with pytest.raises(ImportError, match=r"verifiers >= 0\.4.*empathy-gym\[verifiers\]"):
            __import__(module)
