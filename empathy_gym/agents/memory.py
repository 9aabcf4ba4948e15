"""How much device memory a training recipe needs, worked out from the model's config
before any weight is loaded (:func:`plan_memory`; see docs/training.md, "Memory plan").

Counts assume a Llama/Qwen2-style decoder (q, k, v, o; gated MLP; RMSNorm). They are
estimates: allocator fragmentation, the CUDA context and library workspaces come on top,
which is what the headroom is for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from empathy_gym.agents.engines import sampler_engine

GIB = 1024**3
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class MemoryPlanError(RuntimeError):
    """The recipe does not fit the device; the message holds the plan and what to change."""


@dataclass(frozen=True)
class DecoderShape:
    """The sizes of a decoder-only transformer that memory depends on."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool

    @classmethod
    def from_config(cls, config: Any) -> DecoderShape:
        """From a transformers ``PretrainedConfig`` (its text config for multimodal ones).

        Raises:
            ValueError: a size the plan needs is missing from the config.
        """
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        try:
            heads = int(text.num_attention_heads)
            hidden = int(text.hidden_size)
            return cls(
                layers=int(text.num_hidden_layers),
                hidden=hidden,
                intermediate=int(text.intermediate_size),
                heads=heads,
                kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
                head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
                vocab=int(text.vocab_size),
                tied_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
                qkv_bias=getattr(text, "model_type", "") == "qwen2" or bool(getattr(text, "attention_bias", False)),
            )
        except AttributeError as error:
            raise ValueError(f"the memory plan needs a decoder config with {error.name!r}") from None

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each projection in one layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {
            "q_proj": (self.hidden, q),
            "k_proj": (self.hidden, kv),
            "v_proj": (self.hidden, kv),
            "o_proj": (q, self.hidden),
            "gate_proj": (self.hidden, self.intermediate),
            "up_proj": (self.hidden, self.intermediate),
            "down_proj": (self.intermediate, self.hidden),
        }

    def parameters(self) -> int:
        """All parameters: embeddings, (untied) output head, layers, final norm."""
        per_layer = sum(i * o for i, o in self.linear_shapes().values()) + 2 * self.hidden
        if self.qkv_bias:
            per_layer += (self.heads + 2 * self.kv_heads) * self.head_dim
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * per_layer + embeddings + self.hidden

    def lora_parameters(self, rank: int, targets: Any = "all-linear") -> int:
        """LoRA adapter parameters: rank * (in + out) per targeted projection and layer
        (Hu et al. 2021, arXiv 2106.09685, section 4). ``"all-linear"`` is peft's every
        linear layer but the output head."""
        names = _LINEARS if targets == "all-linear" else [t for t in targets if t in _LINEARS]
        shapes = self.linear_shapes()
        return self.layers * sum(rank * sum(shapes[name]) for name in names)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """2 * layers * kv_heads * head_dim * bytes (vLLM, arXiv 2309.06180, section 2)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes


@dataclass
class MemoryPlan:
    """Rows of ``(what, bytes, how it was counted)`` and the device's capacity."""

    rows: list[tuple[str, int, str]] = field(default_factory=list)
    capacity: int | None = None
    device: str = "cpu"

    @property
    def total(self) -> int:
        return sum(size for _, size, _ in self.rows)

    @property
    def headroom(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.total

    def table(self) -> str:
        """The plan as aligned text, GiB to two decimals."""
        width = max(34, *(len(name) + 2 for name, _, _ in self.rows))
        lines = [f"memory plan ({self.device})", f"  {'part':<{width}}{'GiB':>9}  how"]
        lines += [f"  {name:<{width}}{size / GIB:>9.2f}  {note}" for name, size, note in self.rows]
        lines.append(f"  {'total':<{width}}{self.total / GIB:>9.2f}")
        if self.capacity is not None:
            lines.append(f"  {'device capacity':<{width}}{self.capacity / GIB:>9.2f}")
            cuda = self.device.startswith("cuda")
            spent_on = "(CUDA context, fragmentation, workspaces)" if cuda else "(the rest of the machine)"
            lines.append(f"  {'headroom':<{width}}{self.headroom / GIB:>9.2f}  {spent_on}")
        return "\n".join(lines)

    def check(self, min_headroom: float = 0.05) -> None:
        """Raise when the plan leaves less than ``min_headroom`` of the capacity free.

        Raises:
            MemoryPlanError: with the table and the usual remedies.
        """
        if self.capacity is None or self.headroom >= min_headroom * self.capacity:
            return
        raise MemoryPlanError(
            f"this recipe needs about {self.total / GIB:.1f} GiB but {self.device} has {self.capacity / GIB:.1f} GiB "
            f"(with {min_headroom:.0%} kept free):\n{self.table()}\nTo fit: LoRA (policy.use_lora=true), "
            "policy.gradient_checkpointing=true, critic=shared, a smaller rollout_batch_size, generation.max_new_tokens"
            " or generation.max_context_tokens, or more gradient_accumulation_steps."
        )


def _count(n: int) -> str:
    """A parameter count for the table: ``7.62 B``, ``161.5 M``, ``0.30 M``."""
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e7 else f"{n / 1e6:.2f} M"


def activation_bytes_per_token(
    shape: DecoderShape, dtype_bytes: int = 2, *, fused_attention: bool = True, sequence: int = 0
) -> int:
    """Bytes autograd keeps per token for one decoder layer without recomputation.

    Counted tensor by tensor as Korthikanti et al. 2022 (arXiv 2205.05198, section 4.1)
    count a GPT layer, but for a transformers Llama/Qwen2 layer: the two RMSNorms keep a
    float32 copy of their input (2 x 4h), the attention its input (2h), q through
    projection, rotation, the rotated copy, the attention output and the output
    projection's input (5 x 2q), k and v (4 x 2kv), the gated MLP its input (2h) and
    gate, SiLU, up and product (4 x 2I): ``8h + 2h + 10q + 8kv + 2h + 8I`` bytes
    (Korthikanti's GPT layer: 34h). ``tests/test_memory_plan.py`` checks it against the
    bytes autograd saves.

    Args:
        shape: the decoder's sizes.
        dtype_bytes: bytes of the compute dtype (2 for bfloat16 autocast).
        fused_attention: SDPA / flash attention (no attention scores kept); ``False``:
            eager attention, which keeps the scores and probabilities of ``sequence``
            keys per head (``8 * heads * sequence`` bytes: bf16 scores, float32 softmax,
            its bf16 cast).
        sequence: the sequence length (only with eager attention).
    """
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    half = dtype_bytes
    norms = 2 * 4 * h  # float32 copies inside two RMSNorms
    attention = half * (h + 5 * q + 4 * kv)
    mlp = half * (h + 4 * shape.intermediate)
    scores = 0 if fused_attention else 8 * shape.heads * sequence
    return norms + attention + mlp + scores


def device_capacity(device: Any, processes_on_host: int = 1) -> tuple[int | None, str]:
    """``(bytes, name)`` of a device's memory: a CUDA device's total memory (torch), or
    on CPU the machine's RAM (``os.sysconf``) shared by the processes on this host.
    ``None`` when it cannot be told."""
    import os

    import torch

    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        properties = torch.cuda.get_device_properties(index)
        return int(properties.total_memory), f"cuda:{index} ({properties.name})"
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None, "cpu"
    share = f", 1/{processes_on_host} per process" if processes_on_host > 1 else ""
    return int(ram // max(1, processes_on_host)), f"cpu (RAM{share})"


def read_shape(name: str) -> DecoderShape:
    """The :class:`DecoderShape` of a model from its ``config.json`` (or GGUF header),
    without loading its weights.

    Args:
        name: as ``policy.model`` (path, hub id, ``.gguf`` file or alias, see
            :mod:`empathy_gym.backends.models`).

    Raises:
        OSError: the config cannot be read; ValueError: it lacks a size the plan needs.
    """
    from transformers import AutoConfig

    from empathy_gym.backends.models import resolve_model

    path, gguf_file = resolve_model(name)
    return DecoderShape.from_config(AutoConfig.from_pretrained(path, gguf_file=gguf_file))


def _weight_rows(config: Any, shape: DecoderShape, half: int) -> list[tuple[str, int, str]]:
    """The rows of the weights, gradients and optimizer state: the policy's, a separate
    critic's, and a reference copy for the KL term (without LoRA). Mixed-precision AdamW
    keeps 16 bytes per trained parameter: float32 master weight, gradient and two moments
    (Rajbhandari et al. 2020, ZeRO, arXiv 1910.02054, section 3.1)."""
    policy, total = config.policy, shape.parameters()
    trained = shape.lora_parameters(policy.lora_r, policy.lora_target_modules) if policy.use_lora else total
    rows: list[tuple[str, int, str]] = []
    if policy.use_lora:
        rows.append(("policy weights (frozen)", total * half, f"{_count(total)} params x {half} B"))
        note = f"{_count(trained)} params x 16 B (fp32 weight, grad, 2 moments)"
        rows.append(("LoRA adapters + grads + AdamW", trained * 16, note))
    else:
        note = f"{_count(total)} params x 16 B (fp32 master weight, grad, 2 moments)"
        rows.append(("policy weights + grads + AdamW", total * 16, note))
        if half == 2:
            note = "torch.autocast caches a half-precision copy of each fp32 weight in a forward"
            rows.append(("autocast's bf16 weight copies", total * 2, note))
    if getattr(config, "critic", None) == "separate":
        body = total - (0 if shape.tied_embeddings else shape.vocab * shape.hidden)  # no language-model head
        size = (body * half if policy.use_lora else 0) + trained * 16
        note = "its own backbone without LM head" + (" + LoRA" if policy.use_lora else ", fully trained")
        rows.append(("critic (separate)", size, note))
    kl = config.kl_weight
    if kl and not policy.use_lora:
        rows.append(("reference model (frozen)", total * half, "a copy for the KL term"))
    return rows


def _generation_rows(
    generation: Any, shape: DecoderShape, half: int, batch: int, capacity: int | None
) -> list[tuple[str, int, str]]:
    """The rows of the policy's sampler: the transformers engine's KV cache and kept
    logits for ``batch`` dialogues per ``generate`` call, or vLLM's share of the device."""
    if sampler_engine(generation.engine).kv_in_process:
        context, new = generation.max_context_tokens, generation.max_new_tokens
        kv = batch * context * shape.kv_bytes_per_token(half)
        logits = batch * new * shape.vocab * 4 * 2
        return [
            ("generation KV cache", kv, f"{batch} dialogues per generate call x {context} tokens"),
            ("generation logits kept", logits, f"{batch} x {new} new tokens x {shape.vocab} x fp32, stacked once"),
        ]
    share = getattr(generation, "vllm_gpu_memory_utilization", 0.5)
    note = f"gpu_memory_utilization={share}: weights + KV cache"
    return [("vLLM (its share of the device)", int(share * (capacity or 0)), note)]


def plan_memory(
    config: Any,
    shape: DecoderShape,
    *,
    capacity: int | None = None,
    device: str = "cpu",
    logprob_chunk_tokens: int | None = None,
    processes: int = 1,
    generation_rows: int = 32,
) -> MemoryPlan:
    """The memory a training recipe needs on one device.

    Args:
        config: a :class:`~empathy_gym.agents.config.PPOConfig` or ``GRPOConfig``.
        shape: the policy's :class:`DecoderShape`.
        capacity: the device's memory in bytes (``None``: unknown, no headroom row).
        device: its name, for the table (``"cuda..."`` or ``"cpu..."``).
        logprob_chunk_tokens: positions per chunk of the log-prob pass (``None``:
            ``config.policy.logprob_chunk_tokens``).
        processes: training processes sharing the step's dialogues (each holds
            ``rollout_batch_size / processes``).
        generation_rows: dialogues per ``generate`` call of the transformers engine
            (:class:`~empathy_gym.agents.generation.TransformersGenerator`'s
            ``max_batch_size``).

    Returns:
        A :class:`MemoryPlan`; bytes are integers.
    """
    policy, generation = config.policy, config.generation
    half = BYTES.get(policy.dtype, 2)
    dialogues = max(1, config.rollout_batch_size // max(1, processes))
    micro = max(1, -(-dialogues // (config.num_mini_batches * config.gradient_accumulation_steps)))
    context = generation.max_context_tokens
    tokens = micro * context
    rows = _weight_rows(config, shape, half)
    critic = getattr(config, "critic", None)
    fused = policy.attn_implementation != "eager"
    per_layer = tokens * activation_bytes_per_token(
        shape, 2 if half == 2 else 4, fused_attention=fused, sequence=context
    )
    how = f"{micro} dialogue(s) x {context} tokens per micro-batch"
    copies = 2 if critic == "separate" else 1  # the critic's backbone runs its own pass
    if policy.gradient_checkpointing:
        inputs = shape.layers * tokens * shape.hidden * half
        size = int(copies * inputs + per_layer)
        rows.append(("activations (checkpointed)", size, how + "; layer inputs, one layer recomputed at a time"))
    else:
        rows.append(("activations", int(copies * shape.layers * per_layer), how + ", no checkpointing"))
    chunk = min(tokens, logprob_chunk_tokens or getattr(policy, "logprob_chunk_tokens", tokens) or tokens)
    note = f"{chunk} positions x {shape.vocab} x 14 B (bf16 logits, fp32 copy, softmax, grad)"
    rows.append(("log-prob pass over the vocabulary", chunk * shape.vocab * 14, note))
    rows.extend(_generation_rows(generation, shape, half, min(dialogues, generation_rows), capacity))
    user = config.env.user_spec() if getattr(config, "env", None) is not None else None
    if user is not None and user.on_policy and sampler_engine(generation.engine).kv_in_process:
        backend_kwargs = dict(user.backend_kwargs)
        cached = int(backend_kwargs.get("prefix_cache_tokens", 32768))
        users = min(dialogues, int(backend_kwargs.get("max_batch_size", 16)))
        user_context = min(context, 8192)
        size = (cached + users * user_context) * shape.kv_bytes_per_token(half)
        note = f"KV: {cached} prefix-cache tokens + {users} prompts x {user_context} tokens; no weights of its own"
        rows.append(("simulated user (policy's base weights)", size, note))
    return MemoryPlan(rows, capacity, device)
