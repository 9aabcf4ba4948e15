"""Where the shipped data lives: persona banks and difficulty presets (``envs/``) and
training recipes (``agents/``).

In a source checkout they are the top-level ``envs/`` and ``agents/`` folders; in an
installed wheel setuptools maps them to ``empathy_gym/_envs`` and
``empathy_gym/_recipes`` (see ``setup.cfg``, ``package_dir``).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _locate(installed: str, source: str) -> Path:
    for candidate in (_PACKAGE / installed, _PACKAGE.parent / source):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"cannot find the empathy_gym data folder {source!r}: looked in "
        f"{_PACKAGE / installed} and {_PACKAGE.parent / source}; reinstall the package"
    )


def envs_dir() -> Path:
    """The folder of persona banks (``personas/``, ``rlver/``) and difficulty presets
    (``difficulty/``)."""
    return _locate("_envs", "envs")


def recipes_dir() -> Path:
    """The folder of training recipes (YAML)."""
    return _locate("_recipes", "agents")


def find_recipe(name: str | Path) -> Path:
    """A recipe by path, or by the name of a shipped one: ``"smollm2-cpu-grpo"``,
    ``"smollm2-cpu-grpo.yaml"`` or ``"agents/smollm2-cpu-grpo.yaml"`` all find
    :func:`recipes_dir`'s file when no such file exists where the command runs.

    Raises:
        FileNotFoundError: neither a file at ``name`` nor a shipped recipe of that
            name; the message lists the shipped ones.
    """
    path = Path(name)
    if path.is_file():
        return path
    shipped = recipes_dir()
    stem = path.name.removesuffix(".yaml")
    candidate = shipped / f"{stem}.yaml"
    if candidate.is_file():
        return candidate
    names = ", ".join(sorted(recipe.stem for recipe in shipped.glob("*.yaml")))
    raise FileNotFoundError(f"no recipe {str(name)!r}: not a file here, and not a shipped recipe ({names})")
