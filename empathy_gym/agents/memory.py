"""How much device memory a training recipe needs, worked out before any weight is loaded.

:func:`plan_memory` reads the model's config (sizes only) and the recipe and adds up, in
bytes: the frozen weights, the trained weights (LoRA adapters, or every weight) with
their gradients and AdamW's two moments, a separate critic or a frozen reference when
the recipe has one, the activations of one micro-batch, the log-prob pass over the
vocabulary, and the key/value cache of the generation engine. :class:`MemoryPlan`
prints the table and refuses a recipe that cannot fit (:meth:`MemoryPlan.check`).

Counts assume a Llama/Qwen2-style decoder (attention q, k, v, o; gated MLP gate, up,
down; RMSNorm), which covers the models the recipes use. They are estimates: allocator
fragmentation, CUDA context (~0.5-1 GB) and library workspaces come on top, which is
what the headroom is for.

Sources: mixed-precision AdamW keeps float32 master weights, gradients and two moments,
16 bytes per trained parameter (Rajbhandari et al. 2020, ZeRO, arXiv 1910.02054,
section 3.1, with float32 gradients); activation memory of a transformer layer
~ T * H * (34 + 5 * heads * T / H) bytes in half precision without recomputation, and
only the layer inputs (2 * T * H bytes per layer) with full activation checkpointing
(Korthikanti et al. 2022, arXiv 2205.05198, section 4); KV cache = 2 * layers *
kv_heads * head_dim * bytes per token (vLLM, arXiv 2309.06180, section 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GIB = 1024 ** 3
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
    def from_config(cls, config: Any) -> "DecoderShape":
        """From a transformers ``PretrainedConfig`` (its text config for multimodal ones).

        Raises:
            ValueError: a size the plan needs is missing from the config.
        """
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        try:
            heads = int(text.num_attention_heads)
            hidden = int(text.hidden_size)
            return cls(layers=int(text.num_hidden_layers), hidden=hidden,
                       intermediate=int(text.intermediate_size), heads=heads,
                       kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
                       head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
                       vocab=int(text.vocab_size),
                       tied_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
                       qkv_bias=getattr(text, "model_type", "") == "qwen2" or bool(getattr(text, "attention_bias", False)))
        except AttributeError as error:
            raise ValueError(f"the memory plan needs a decoder config with {error.name!r}") from None

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each projection in one layer."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"q_proj": (self.hidden, q), "k_proj": (self.hidden, kv), "v_proj": (self.hidden, kv),
                "o_proj": (q, self.hidden), "gate_proj": (self.hidden, self.intermediate),
                "up_proj": (self.hidden, self.intermediate), "down_proj": (self.intermediate, self.hidden)}

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
        lines = [f"memory plan ({self.device})", f"  {'part':<34}{'GiB':>9}  how"]
        lines += [f"  {name:<34}{size / GIB:>9.2f}  {note}" for name, size, note in self.rows]
        lines.append(f"  {'total':<34}{self.total / GIB:>9.2f}")
        if self.capacity is not None:
            lines.append(f"  {'device capacity':<34}{self.capacity / GIB:>9.2f}")
            lines.append(f"  {'headroom':<34}{self.headroom / GIB:>9.2f}  (CUDA context, fragmentation, workspaces)")
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
            "policy.gradient_checkpointing=true, critic=shared, a smaller rollout_batch_size or "
            "generation.max_context_tokens, or more gradient_accumulation_steps.")


def plan_memory(config: Any, shape: DecoderShape, *, capacity: int | None = None,
                device: str = "cpu", logprob_chunk_tokens: int | None = None) -> MemoryPlan:
    """The memory a training recipe needs on one device.

    Args:
        config: a :class:`~empathy_gym.agents.config.PPOConfig` or ``GRPOConfig``.
        shape: the policy's :class:`DecoderShape`.
        capacity: the device's memory in bytes (``None``: unknown, no headroom row).
        device: its name, for the table.
        logprob_chunk_tokens: tokens per chunk of the log-prob pass over the vocabulary
            (``None``: the whole micro-batch at once).

    Returns:
        A :class:`MemoryPlan`; bytes are integers.
    """
    policy, generation = config.policy, config.generation
    half = BYTES.get(policy.dtype, 2)
    total = shape.parameters()
    rows: list[tuple[str, int, str]] = []
    dialogues_per_process = config.rollout_batch_size
    micro = max(1, -(-dialogues_per_process // (config.num_mini_batches * config.gradient_accumulation_steps)))
    tokens = micro * generation.max_context_tokens
    if policy.use_lora:
        trained = shape.lora_parameters(policy.lora_r, policy.lora_target_modules)
        rows.append(("policy weights (frozen)", total * half, f"{total / 1e9:.2f} B params x {half} B"))
        rows.append(("LoRA adapters + grads + AdamW", trained * 16,
                     f"{trained / 1e6:.1f} M params x 16 B (fp32 weight, grad, 2 moments)"))
    else:
        trained = total
        rows.append(("policy weights + grads + AdamW", total * 16,
                     f"{total / 1e9:.2f} B params x 16 B (fp32 master weight, grad, 2 moments)"))
    critic = getattr(config, "critic", None)
    if critic == "separate":
        critic_trained = shape.lora_parameters(policy.lora_r, policy.lora_target_modules) if policy.use_lora else total
        body = total - (0 if shape.tied_embeddings else shape.vocab * shape.hidden)   # no language-model head
        rows.append(("critic (separate)", (body * half if policy.use_lora else 0) + critic_trained * 16,
                     "its own backbone without LM head" + (" + LoRA" if policy.use_lora else ", fully trained")))
    kl = getattr(config, "kl_coef", 0.0) or getattr(config, "beta", 0.0)
    if kl and not policy.use_lora:
        rows.append(("reference model (frozen)", total * half, "a copy for the KL term"))
    layer_inputs = shape.layers * tokens * shape.hidden * half
    # fused attention (flash / memory-efficient SDPA on CUDA) never stores the a*s*s scores
    fused = policy.attn_implementation in ("sdpa", "flash_attention_2", "flash_attention_3") and device.startswith("cuda")
    scores = 0 if fused else 5 * shape.heads * generation.max_context_tokens / shape.hidden
    per_layer = tokens * shape.hidden * (34 + scores) * half / 2
    how = f"{micro} dialogue(s) x {generation.max_context_tokens} tokens per micro-batch"
    if policy.gradient_checkpointing:
        rows.append(("activations (checkpointed)", int(layer_inputs + per_layer), how))
    else:
        rows.append(("activations", int(shape.layers * per_layer), how + ", no checkpointing"))
    chunk = min(tokens, logprob_chunk_tokens or tokens)
    rows.append(("log-prob pass over the vocabulary", chunk * shape.vocab * 4 * 3,
                 f"{chunk} tokens x {shape.vocab} x fp32 (logits, log-softmax, grad)"))
    if generation.engine == "transformers":
        kv = dialogues_per_process * generation.max_context_tokens * shape.kv_bytes_per_token(half)
        rows.append(("generation KV cache", kv,
                     f"{dialogues_per_process} dialogues x {generation.max_context_tokens} tokens"))
    else:
        share = getattr(generation, "vllm_gpu_memory_utilization", 0.5)
        rows.append(("vLLM (its share of the device)", int(share * (capacity or 0)),
                     f"gpu_memory_utilization={share}: weights + KV cache"))
    return MemoryPlan(rows, capacity, device)
