"""The wheel ships the data (persona banks, presets, prompts) and works outside the
source tree."""

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        cwd=tmp_path_factory.mktemp("build"),
    )
    (path,) = out.glob("empathy_gym-*.whl")
    return path


def test_wheel_contents(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in [
        "empathy_gym/_envs/personas/en.jsonl",
        "empathy_gym/_envs/personas/zh.jsonl",
        "empathy_gym/_envs/rlver/train_profile.jsonl",
        "empathy_gym/_envs/rlver/LICENSE.txt",
        "empathy_gym/_envs/sage/profiles.jsonl",
        "empathy_gym/_envs/sage/LICENSE.txt",
        "empathy_gym/_envs/difficulty/challenging.json",
        "empathy_gym/_envs/capabilities/empathy_math.yaml",
        "empathy_gym/_envs/capabilities/empathy_humaneval.yaml",
        "empathy_gym/_envs/capabilities/utils.py",
        "empathy_gym/_envs/capabilities/math.jsonl",
        "empathy_gym/user/persona.schema.json",
        "empathy_gym/user/prompts/zh/appraisal.txt",
        "empathy_gym/user/prompts/en/bands.json",
        "empathy_gym/user/rules/en.json",
        "empathy_gym/user/distilled/appraiser.json",
        "empathy_gym/user/distilled/head.safetensors",
        "empathy_gym/user/distilled/MODEL_CARD.md",
        "empathy_gym/strategy_templates/en.json",
        "empathy_gym/strategy_templates/zh.json",
        "empathy_gym/_recipes/smollm2-cpu-ppo-matched.yaml",
        "empathy_gym/_recipes/studies/ppo-vs-grpo.yaml",
        "empathy_gym/_recipes/studies/difficulty.yaml",
    ]:
        assert expected in names, expected
    # empathy_dialogue.py: the verifiers plugin module (taskset id "empathy-dialogue")
    assert not [
        n for n in names if n.split("/")[0] not in ("empathy_gym", "empathy_dialogue.py") and ".dist-info" not in n
    ]


def test_installed_wheel_makes_an_env_in_a_fresh_venv(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # Without PYTHONPATH: pointing at the source tree, where the build leaves an egg-info, it
    # makes pip believe the package is installed already, and pip skips the wheel.
    clean_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        env=clean_env,
    )
    # Dependencies come from this interpreter's site-packages, added after the new venv's own.
    site = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    script = (
        "import sys, gymnasium as gym, empathy_gym\n"
        "assert empathy_gym.__file__.startswith(sys.prefix), empathy_gym.__file__\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
        "env = gym.make('EmpathyDialogue-v0')\n"
        "obs, info = env.reset(seed=0)\n"
        "obs, r, term, trunc, info = env.step('That sounds really hard. What happened?')\n"
        "rl = gym.make('EmpathyDialogue-RLVER-v0').unwrapped\n"
        "from empathy_gym.agents.config import load_recipe\n"
        "config = load_recipe('agents/smollm2-cpu-grpo.yaml')\n"  # no agents/ here: the shipped one
        "assert config.policy.model == load_recipe('smollm2-cpu-grpo').policy.model\n"
        "from empathy_gym.agents.study import find_study\n"
        "assert find_study('ppo-vs-grpo').parent.name == 'studies'\n"
        "print(len(env.unwrapped.personas), len(rl.personas), type(r).__name__)\n"
    )
    result = subprocess.run([str(python), "-c", script], capture_output=True, text=True, cwd=tmp_path, env=clean_env)
    assert result.returncode == 0, result.stderr
    n_builtin, n_rlver, reward_type = result.stdout.split()
    assert int(n_builtin) >= 56 and int(n_rlver) == 500 and reward_type == "float"


def test_the_training_configs_and_cli_import_without_torch():
    """Recipes load and ``train_*.py --help`` answers before torch is imported (seconds)."""
    script = (
        "import sys\n"
        "from empathy_gym.agents import load_recipe\n"
        "from empathy_gym.agents.cli import train_main\n"
        "load_recipe('agents/tiny-cpu.yaml', algorithm='ppo')\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
