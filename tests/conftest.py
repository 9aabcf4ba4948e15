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
