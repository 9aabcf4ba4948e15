"""Batched sampling that reuses the key/value (KV) states of prompts seen before.

Each turn of a dialogue repeats the previous prompt, so :func:`sample_batch` keeps the
KV states it computed in a :class:`PrefixKVCache` and prefills only the tokens after a
new prompt's longest common prefix with a cached sequence (vLLM's automatic prefix
caching, for ``transformers`` models). Batch layout, for rows with cached prefixes of
lengths n_r and new suffixes s_r (each left-padded into its own block):

    [pad .. | cached prefix (n_r) | pad .. | suffix (s_r)] -> generated tokens

The attention mask hides every pad and position ids count only real tokens, so each
row sees what it would see alone: in exact arithmetic the result equals a full prefill.

Each row samples with its own ``torch.Generator``: temperature, then top-p
(transformers' ``TemperatureLogitsWarper`` and ``TopPLogitsWarper``), then one
``torch.multinomial`` draw; temperature 0 is greedy. The log-probability recorded for a
sampled token is ``log_softmax(logits / temperature)`` at that token (before top-p), as
the trainer computes it.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class _Entry:
    ids: np.ndarray  # (T,) int64
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (H, T, D) keys and values


@dataclass
class CacheStats:
    """Token counts since the cache was made.

    Attributes:
        prompt_tokens: prompt tokens asked for.
        reused_tokens: of those, served from cached KV states.
        prefilled_tokens: of those, computed (``prompt_tokens - reused_tokens``).
    """

    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefilled_tokens: int = 0


@dataclass
class PrefixKVCache:
    """The KV states of recently computed token sequences, served by longest common prefix.

    Args:
        max_tokens: the most tokens held over all entries (>= 0; 0 disables reuse). The
            least recently used entries go first. Memory per token is
            ``2 * layers * kv_heads * head_dim * bytes`` (SmolLM2-135M in float32: 46 KB;
            Qwen2.5-7B in bfloat16: 57 KB).

    Entries hold states of one set of weights: call :meth:`clear` when the weights change
    (a trainer does after every update).
    """

    max_tokens: int = 32768
    entries: OrderedDict = field(default_factory=OrderedDict, repr=False)
    stats: CacheStats = field(default_factory=CacheStats)
    _next_key: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 0:
            raise ValueError(f"PrefixKVCache: max_tokens must be an int >= 0, got {self.max_tokens!r}")

    @property
    def tokens(self) -> int:
        """Tokens held now."""
        return sum(len(entry.ids) for entry in self.entries.values())

    def clear(self) -> None:
        """Drop every entry (the counts in :attr:`stats` stay)."""
        self.entries.clear()

    def lookup(self, ids: Sequence[int], limit: int | None = None) -> tuple[int, _Entry | None]:
        """``(n, entry)``: the longest common prefix of ``ids`` with a cached sequence,
        at most ``len(ids) - 1`` tokens (the last prompt token is always computed, it
        gives the next-token logits) and at most ``limit``; ``(0, None)`` when nothing
        is shared."""
        query = np.asarray(ids, dtype=np.int64)
        most = len(query) - 1 if limit is None else min(len(query) - 1, limit)
        best, best_key = 0, None
        for key, entry in self.entries.items():
            width = min(len(entry.ids), most)
            if width <= best:
                continue
            differs = np.flatnonzero(entry.ids[:width] != query[:width])
            common = int(differs[0]) if len(differs) else width
            if common > best:
                best, best_key = common, key
        if best_key is None:
            return 0, None
        self.entries.move_to_end(best_key)
        return best, self.entries[best_key]

    def discard(self, ids: Sequence[int]) -> None:
        """Drop the entry of exactly ``ids``, if any: a sequence its owner will not extend
        (its end token replaced), which :meth:`add` would otherwise keep until it is the
        least recently used."""
        query = np.asarray(ids, dtype=np.int64)
        for key in [k for k, e in self.entries.items() if np.array_equal(e.ids, query)]:
            del self.entries[key]

    def add(self, ids: Sequence[int], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep the states of ``ids`` (per layer (H, T, D) keys and values, T = len(ids)).
        Entries that are a prefix of ``ids`` are dropped (this one covers them)."""
        if self.max_tokens == 0 or len(ids) == 0:
            return
        new = np.asarray(ids, dtype=np.int64)
        for key in [
            k for k, e in self.entries.items() if len(e.ids) <= len(new) and np.array_equal(e.ids, new[: len(e.ids)])
        ]:
            del self.entries[key]
        if len(new) > self.max_tokens:
            return
        self.entries[self._next_key] = _Entry(new, layers)
        self._next_key += 1
        total = self.tokens
        while total > self.max_tokens:
            _, dropped = self.entries.popitem(last=False)
            total -= len(dropped.ids)


@dataclass
class SampledRow:
    """One row of :func:`sample_batch`: the sampled ids (an end token included when one
    was drawn), their log-probs (float, natural log, after temperature) and whether an
    end token ended the row."""

    token_ids: list[int]
    logprobs: list[float]
    finished: bool


def _cache_argument(model: Any) -> str:
    """The name under which the model's forward takes a KV cache: ``cache``
    (transformers >= 5.2x) or ``past_key_values`` (earlier)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _returned_cache(output: Any) -> Any:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def _plain_layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Per-layer (keys, values) of a DynamicCache of plain layers; ``None`` for other
    cache structures (sliding windows, quantised), which are not reused."""
    layers = getattr(cache, "layers", None)
    if layers is None or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
        return None
    return [(layer.keys, layer.values) for layer in layers]


def _next_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generators: Sequence[torch.Generator] | None
) -> torch.Tensor:
    """(B, V) float logits -> (B,) int64 tokens (see the module docstring)."""
    if temperature == 0:
        return logits.argmax(-1)
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    scores = TemperatureLogitsWarper(temperature)(None, logits)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    probs = torch.softmax(scores.float(), dim=-1)
    return torch.cat(
        [torch.multinomial(probs[row], 1, generator=generator) for row, generator in enumerate(generators)]
    )


class _Batch:
    """The padded batch of :func:`prefill`, extended column by column while decoding."""

    def __init__(
        self,
        model: Any,
        prompts: list[list[int]],
        pad_id: int,
        cache: PrefixKVCache | None,
        compute_dtype: torch.dtype | None,
        reuse_limits: Sequence[int] | None = None,
    ):
        self.model, self.prompts, self.cache = model, prompts, cache
        self.device = next(model.parameters()).device
        self.cache_name = _cache_argument(model)
        self.autocast = (compute_dtype, self.device.type)
        limits = reuse_limits if reuse_limits is not None else [None] * len(prompts)
        found = [cache.lookup(p, limit) if cache is not None else (0, None) for p, limit in zip(prompts, limits)]
        self.cached = cached = [n for n, _ in found]
        width_cached = max(cached)
        suffixes = [p[n:] for p, n in zip(prompts, cached)]
        width_new = max(len(s) for s in suffixes)
        if cache is not None:
            cache.stats.prompt_tokens += sum(len(p) for p in prompts)
            cache.stats.reused_tokens += sum(cached)
            cache.stats.prefilled_tokens += sum(len(s) for s in suffixes)
        count = len(prompts)
        self.ids = torch.full((count, width_new), pad_id, dtype=torch.long)
        self.mask = torch.zeros((count, width_cached + width_new), dtype=torch.long)
        self.positions = torch.zeros((count, width_new), dtype=torch.long)
        for row, (n, suffix) in enumerate(zip(cached, suffixes)):
            self.ids[row, width_new - len(suffix) :] = torch.tensor(suffix)
            self.mask[row, width_cached - n : width_cached] = 1
            self.mask[row, width_cached + width_new - len(suffix) :] = 1
            self.positions[row, width_new - len(suffix) :] = torch.arange(n, n + len(suffix))
        self.past = None
        if width_cached:
            from transformers import DynamicCache

            donor = next(e for _, e in found if e is not None)
            layers = []
            for layer, (template, _) in enumerate(donor.layers):
                keys = template.new_zeros((count, template.shape[0], width_cached, template.shape[2]))
                values = torch.zeros_like(keys)
                for row, (n, entry) in enumerate(found):
                    if n:
                        keys[row, :, width_cached - n :] = entry.layers[layer][0][:, :n]
                        values[row, :, width_cached - n :] = entry.layers[layer][1][:, :n]
                layers.append((keys, values))
            self.past = DynamicCache(layers)

    def run(self, ids: torch.Tensor, positions: torch.Tensor, **options: Any) -> Any:
        """Run ``ids`` (B, t) at ``positions`` (B, t) after what is cached (``self.mask`` must
        already cover them); returns the model's output (``options``: more forward arguments)."""
        dtype, device_type = self.autocast
        with torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = self.model(
                input_ids=ids.to(self.device),
                attention_mask=self.mask.to(self.device),
                position_ids=positions.to(self.device),
                use_cache=True,
                logits_to_keep=1,
                **{self.cache_name: self.past},
                **options,
            )
        self.past = _returned_cache(out)
        return out

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """:meth:`run`, returning the last position's logits, (B, V) float32."""
        return self.run(ids, positions).logits[:, -1, :].float()

    def prefill(self) -> torch.Tensor:
        return self.forward(self.ids, self.positions)

    def store(self, sequences: Sequence[Sequence[int]], rows: Sequence[bool] | None = None) -> None:
        """Add each row's attended states to the cache, as the states of ``sequences[row]``
        (only the rows where ``rows`` is True, when given)."""
        if self.cache is None or self.cache.max_tokens == 0:
            return
        layers = _plain_layers(self.past)
        if layers is None:
            return
        for row, sequence in enumerate(sequences):
            if rows is not None and not rows[row]:
                continue
            columns = torch.nonzero(self.mask[row]).squeeze(-1).to(self.device)
            if len(columns) == len(sequence):
                self.cache.add(sequence, [(k[row][:, columns].clone(), v[row][:, columns].clone()) for k, v in layers])


def _check_prompts(prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    return [list(map(int, p)) for p in prompts]


@torch.inference_mode()
def next_token_logits(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    pad_id: int,
    cache: PrefixKVCache | None = None,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The next-token logits after each prompt, (B, V) float32, prefilling only what
    ``cache`` does not hold (and keeping the prompts' states in it).

    Raises:
        ValueError: an empty prompt.
    """
    prompts = _check_prompts(prompts)
    if not prompts:
        return torch.zeros((0, 0))
    batch = _Batch(model, prompts, pad_id, cache, compute_dtype)
    logits = batch.prefill()
    batch.store(prompts)
    return logits


@torch.inference_mode()
def suffix_hidden_states(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    pad_id: int,
    layers: Sequence[int],
    cache: PrefixKVCache | None = None,
    reuse_limits: Sequence[int] | None = None,
    store: Sequence[bool] | None = None,
    compute_dtype: torch.dtype | None = None,
) -> list[tuple[int, torch.Tensor]]:
    """The hidden states of each prompt's tokens that ``cache`` does not hold.

    Args:
        prompts: B lists of token ids, each non-empty.
        layers: indices into the model's ``hidden_states`` (0: the embeddings, i: after
            layer i; the last one is after the final norm in Llama-style models).
        reuse_limits: per prompt, the most tokens to take from ``cache`` (so that the
            states of the tokens from there on are computed and returned).
        store: per prompt, whether to keep its states in ``cache`` (default: all).

    Returns:
        per prompt ``(n, states)``: ``n`` tokens were served by the cache, and
        ``states`` (len(layers), len(prompt) - n, hidden) float32 belong to the rest.

    Raises:
        ValueError: an empty prompt.
    """
    prompts = _check_prompts(prompts)
    if not prompts:
        return []
    batch = _Batch(model, prompts, pad_id, cache, compute_dtype, reuse_limits)
    out = batch.run(batch.ids, batch.positions, output_hidden_states=True)
    stacked = torch.stack([out.hidden_states[layer] for layer in layers], dim=1).float()  # (B, L, t, H)
    batch.store(prompts, store)
    width = stacked.shape[2]
    return [
        (n, stacked[row, :, width - (len(prompt) - n) :].cpu())
        for row, (n, prompt) in enumerate(zip(batch.cached, prompts))
    ]


@torch.inference_mode()
def sample_batch(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int | Sequence[int],
    eos_ids: Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seeds: Sequence[int] | None = None,
    cache: PrefixKVCache | None = None,
    compute_dtype: torch.dtype | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[SampledRow]:
    """Sample one continuation per prompt, prefilling only what ``cache`` does not hold.

    Args:
        model: a causal LM (transformers, or a peft model around one), in eval mode.
        prompts: B lists of token ids, each non-empty.
        max_new_tokens: the most tokens to sample, for all rows (int) or per row (B ints,
            each >= 1).
        eos_ids: ids that end a row (the end token is kept in its ids).
        pad_id: the id written at padding positions (never attended to).
        temperature: >= 0; 0 is greedy.
        top_p: nucleus mass in (0, 1].
        seeds: B ints, one ``torch.Generator`` each (required when temperature > 0).
        cache: where KV states are looked up and stored (``None``: no reuse).
        compute_dtype: run under ``torch.autocast`` in this dtype (bfloat16 mixed precision).
        should_stop: polled before every decoding step; True ends all rows there
            (unfinished).

    Returns:
        B :class:`SampledRow`, in prompt order.

    Raises:
        ValueError: an empty prompt, a limit < 1, or missing seeds with temperature > 0.
    """
    count = len(prompts)
    if count == 0:
        return []
    prompts = _check_prompts(prompts)
    limits = [int(max_new_tokens)] * count if isinstance(max_new_tokens, int) else [int(m) for m in max_new_tokens]
    if len(limits) != count or min(limits) < 1:
        raise ValueError(
            f"sample_batch: max_new_tokens must be >= 1 for each of the {count} rows, got {max_new_tokens}"
        )
    if temperature > 0 and (seeds is None or len(seeds) != count):
        raise ValueError(f"sample_batch: temperature > 0 needs one seed per row ({count})")
    batch = _Batch(model, prompts, pad_id, cache, compute_dtype)
    generators = [torch.Generator(device=batch.device).manual_seed(int(s)) for s in seeds] if temperature > 0 else None
    end_ids = {int(i) for i in eos_ids}
    logits = batch.prefill()
    tokens: list[list[int]] = [[] for _ in range(count)]
    logprobs: list[list[float]] = [[] for _ in range(count)]
    finished = [False] * count
    fed = [0] * count  # sampled tokens whose states are in the batch cache
    next_position = torch.tensor([len(p) for p in prompts])
    scale = temperature if temperature > 0 else 1.0
    while True:
        chosen = _next_tokens(logits, temperature, top_p, generators)
        chosen_logprobs = torch.log_softmax(logits / scale, dim=-1).gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
        feed = torch.full((count, 1), pad_id, dtype=torch.long)
        live = torch.zeros(count, dtype=torch.long)
        for row in range(count):
            if finished[row]:
                continue
            token = int(chosen[row])
            tokens[row].append(token)
            logprobs[row].append(float(chosen_logprobs[row]))
            finished[row] = token in end_ids or len(tokens[row]) >= limits[row]
            feed[row, 0], live[row] = token, 1  # a just-drawn end token is fed too: its states are reusable
        if all(finished) or (should_stop is not None and should_stop()):
            break
        batch.mask = torch.cat([batch.mask, live.unsqueeze(1)], dim=1)
        logits = batch.forward(feed, next_position.unsqueeze(1))
        fed = [f + int(alive) for f, alive in zip(fed, live)]
        next_position += live
    batch.store([p + t[:f] for p, t, f in zip(prompts, tokens, fed)])
    return [SampledRow(t, lp, bool(t) and t[-1] in end_ids) for t, lp in zip(tokens, logprobs)]
