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

import re
import time
from pathlib import Path

import pytest
from layered_venv import VERIFIERS_0_4, LayerUnavailable, check_passed, layered_venv, run_pytest

CHECKS = Path(__file__).resolve().parent / "layered" / "verifiers_checks.py"


def test_environment_against_verifiers_0_4_0(measured):
    try:
        python, build_s = layered_venv("verifiers-0.4.0", VERIFIERS_0_4)
    except LayerUnavailable as error:
        pytest.skip(f"verifiers 0.4.0 cannot be installed on this machine: {error}")
    expected = len(re.findall(r"^def test_", CHECKS.read_text(), flags=re.M))
    start = time.monotonic()
    check_passed(run_pytest(python, CHECKS), expected)
    measured(
        f"verifiers 0.4.0 layer: built in {build_s:.0f} s (0 = cached); "
        f"{expected} environment checks ran in {time.monotonic() - start:.0f} s"
    )


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
