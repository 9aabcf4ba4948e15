"""Load a script of ``benchmarks/`` or ``examples/`` as a module, for tests that call its
functions (``main``, its checks) rather than run it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: Path) -> ModuleType:
    """The script at ``path`` executed as a module named after its file. Its folder goes on
    ``sys.path`` (a benchmark imports ``_machine.py`` beside it) and the module into
    ``sys.modules`` (dataclasses look their module up there)."""
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
