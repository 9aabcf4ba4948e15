"""benchmarks/gpu_check.py at a tiny shape on CPU, in an environment holding only what the
lent GPU machine has (torch, transformers, peft, accelerate and their requirements) plus
what the carried wheels bring (gpu_check.NEEDED and their requirements)."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_check  # noqa: E402

#: What the GPU machine has (the issue: torch, transformers, peft, accelerate, nothing else).
ON_THE_MACHINE = ("torch", "transformers", "peft", "accelerate")


def requirement_closure(roots: tuple[str, ...]) -> set[str]:
    """The installed distributions ``roots`` need, transitively (extras left out)."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    environment = {**default_environment(), "extra": ""}
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:  # e.g. CUDA-only requirements of torch
            continue
        seen.add(name)
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                todo.append(requirement.name)
    return seen


def restricted_site(folder: Path, distributions: set[str]) -> Path:
    """A site folder of links to the files of ``distributions`` only."""
    folder.mkdir()
    for name in distributions:
        dist = metadata.distribution(name)
        base = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            source, link = base / top, folder / top
            if source.exists() and not link.exists() and top != "__pycache__":
                link.symlink_to(source)
    return folder


def test_the_check_runs_at_a_tiny_shape_with_only_what_the_gpu_machine_has(tmp_path):
    """The whole path (memory plan, random Qwen2, LoRA, separate critic, transformers
    engine, user: policy, PPO steps) runs where only the machine's packages and the
    wheels' are importable, and prints the table the issue asks for. Any import of
    another of our requirements (matplotlib, scipy, tensorboard, ...) that is not
    optional fails it."""
    allowed = requirement_closure(ON_THE_MACHINE) | requirement_closure(gpu_check.NEEDED)
    assert not allowed & {"matplotlib", "scipy", "tensorboard", "stable-baselines3", "gguf", "tenacity"}
    site = restricted_site(tmp_path / "site", allowed)
    out = tmp_path / "report.txt"
    runner = (
        f"import sys; sys.path.insert(0, {str(site)!r}); sys.argv[0] = 'gpu_check.py'; "
        "import runpy; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    completed = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            runner,
            "--tiny",
            "--device",
            "cpu",
            "--steps",
            "2",
            "--dialogues",
            "2",
            "--turns",
            "2",
            "--reply-tokens",
            "6",
            "--user-tokens",
            "6",
            "--context",
            "384",
            "--out",
            str(out),
        ],
        cwd=REPO / "benchmarks",
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    report = out.read_text()
    assert report.strip() in completed.stdout
    for part in (
        "policy weights (frozen)",
        "LoRA adapters + grads + AdamW",
        "critic (separate)",
        "activations (checkpointed)",
        "log-prob pass over the vocabulary",
        "generation KV cache",
        "simulated user (policy's base weights)",
        "total",
        "headroom",
    ):
        assert re.search(rf"^  {re.escape(part)}\s+\d+\.\d\d", report, re.M), part
    header = next(line for line in report.splitlines() if line.lstrip().startswith("step"))
    assert header.split() == [
        "step",
        "gen",
        "s",
        "user",
        "s",
        "update",
        "s",
        "step",
        "s",
        "gen",
        "tok/s",
        "turns",
        "peak",
        "alloc",
        "GiB",
        "peak",
        "reserved",
        "GiB",
    ]
    rows = [line.split() for line in report.splitlines() if re.match(r"^\s+[12]\s+\d", line)]
    assert [row[0] for row in rows] == ["1", "2"]
    for row in rows:
        generation, user, update, step = map(float, row[1:5])
        assert generation > 0 and user > 0 and update > 0 and step >= generation + user + update - 0.2
        assert float(row[5]) > 0 and float(row[6]) == 2.0  # tokens/s; both turns played
        assert row[7:] == ["-", "-"]  # no CUDA peak on CPU
    assert "user: policy (adapters off)" in report and "2 dialogues x 2 turns" in report
    assert "plan total" in report


def wheel(folder: Path, name: str, tag: str, module: str) -> Path:
    path = folder / f"{name}-1.0-{tag}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{module}/__init__.py", f"WHEEL = {path.name!r}\n")
        archive.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    return path


def test_only_the_wheels_that_fit_this_python_are_unpacked(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheel(folder, "purepkg", "py3-none-any", "purepkg")
    wheel(folder, "binpkg", "cp27-cp27m-manylinux1_x86_64", "binpkg_old")  # no Python 2.7 here
    version = f"cp{sys.version_info.major}{sys.version_info.minor}"
    from packaging.tags import sys_tags

    platform_tag = next(t.platform for t in sys_tags() if t.interpreter == version and t.abi == version)
    wheel(folder, "binpkg", f"{version}-{version}-{platform_tag}", "binpkg_new")
    target = tmp_path / "site"
    unpacked = gpu_check.unpack_wheels(folder, target)
    assert unpacked == sorted(["purepkg-1.0-py3-none-any.whl", f"binpkg-1.0-{version}-{version}-{platform_tag}.whl"])
    assert (target / "purepkg" / "__init__.py").exists() and (target / "binpkg_new").is_dir()
    assert not (target / "binpkg_old").exists()


def test_a_missing_dependency_without_wheels_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "NEEDED", ("surely_not_installed_module",))
    monkeypatch.setattr(gpu_check, "REPO", tmp_path)
    with pytest.raises(SystemExit, match="surely_not_installed_module.*gpu_wheels.sh"):
        gpu_check.ensure_dependencies(tmp_path / "gpu_wheels")
