"""From trajectories to training tensors, and log-probs from a forward pass.

Every per-token quantity of the update (log-probs, values, rewards, advantages) is
*flat*: one 1-D tensor per trajectory holding only its trainable tokens, in order, so
GAE over it runs over trainable tokens only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from empathy_gym.agents.rollout import Trajectory


@dataclass
class TokenData:
    """One trajectory, ready for forward passes.

    Attributes:
        input_ids: (L,) int64, the whole dialogue.
        target_mask: (L-1,) bool; ``target_mask[t]`` is True when ``input_ids[t+1]`` was
            sampled by the policy (the logits at position t predict it).
        turn_rewards: (n,) float32 over the trainable tokens: each turn's reward on its
            last token, 0 elsewhere.
        turn_index: (n,) int64, the agent turn (0-based) each trainable token belongs to.
        bootstrap: the dialogue was cut at the context limit, not ended, so PPO
            bootstraps from the value of its last position.
        rollout_logprobs: (n,) float32, the sampler's log-probs of the trainable tokens
            (``None`` when not recorded), for the sampler-mismatch statistics and
            truncated importance sampling (:mod:`~empathy_gym.agents.mismatch`).
    """

    input_ids: torch.Tensor
    target_mask: torch.Tensor
    turn_rewards: torch.Tensor
    turn_index: torch.Tensor
    bootstrap: bool = False
    rollout_logprobs: torch.Tensor | None = None

    @property
    def num_trainable(self) -> int:
        return int(self.target_mask.sum())


def to_token_data(trajectory: Trajectory) -> TokenData:
    """Convert a :class:`Trajectory` (see :class:`TokenData` for the layout)."""
    ids = torch.tensor(trajectory.token_ids, dtype=torch.long)
    mask = torch.tensor(trajectory.loss_mask[1:], dtype=torch.bool)
    flat_position = torch.cumsum(mask.long(), 0) - 1  # flat index of each target position
    n = int(mask.sum())
    rewards = torch.zeros(n, dtype=torch.float32)
    turn_index = torch.zeros(n, dtype=torch.long)
    previous_end = -1
    for turn, (end, reward) in enumerate(zip(trajectory.turn_ends, trajectory.rewards)):
        last = int(flat_position[end - 1])
        rewards[last] += reward
        turn_index[previous_end + 1 : last + 1] = turn
        previous_end = last
    sampled = torch.tensor(trajectory.rollout_logprobs[1:], dtype=torch.float32)[mask]
    return TokenData(ids, mask, rewards, turn_index, bootstrap=trajectory.cut, rollout_logprobs=sampled)


def pad_flat(values: Sequence[torch.Tensor], fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D tensors of different lengths: ``(padded (N, n_max), valid (N, n_max) bool)``."""
    width = max((len(v) for v in values), default=0)
    padded = torch.full((len(values), width), fill, dtype=values[0].dtype if values else torch.float32)
    valid = torch.zeros((len(values), width), dtype=torch.bool)
    for row, v in enumerate(values):
        padded[row, : len(v)] = v
        valid[row, : len(v)] = True
    return padded, valid


def unpad_flat(padded: torch.Tensor, valid: torch.Tensor) -> list[torch.Tensor]:
    """The inverse of :func:`pad_flat`."""
    return [row[mask] for row, mask in zip(padded, valid)]


def collate(
    data: Sequence[TokenData], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad a micro-batch: ``input_ids (b, L)``, ``attention_mask (b, L)``,
    ``target_mask (b, L-1)`` (False on padding), on ``device``."""
    width = max(len(d.input_ids) for d in data)
    ids = torch.full((len(data), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(data), width), dtype=torch.long)
    targets = torch.zeros((len(data), width - 1), dtype=torch.bool)
    for row, d in enumerate(data):
        ids[row, : len(d.input_ids)] = d.input_ids
        attention[row, : len(d.input_ids)] = 1
        targets[row, : len(d.target_mask)] = d.target_mask
    return ids.to(device), attention.to(device), targets.to(device)


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, target_mask: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability and entropy of the policy at the trainable tokens, from full
    logits (the reference computation; the trainer uses :func:`chunked_logprobs`).

    Args:
        logits: (b, L, V) from the model.
        input_ids: (b, L).
        target_mask: (b, L-1) bool (see :class:`TokenData`).
        temperature: the sampling temperature; logits are divided by it so the ratio is
            taken against the distribution the tokens were sampled from.

    Returns:
        ``(logprobs, entropy)``, each (n,) float32 over the True positions of
        ``target_mask`` in row-major order. Entropy H = logsumexp(z) - sum softmax(z) z.
    """
    return _from_logits(logits[:, :-1][target_mask], input_ids[:, 1:][target_mask], temperature)


#: Tokens per chunk of the log-prob pass.
DEFAULT_CHUNK_TOKENS = 1024


def _from_logits(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, entropy: bool = True, entropy_grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """(n,) float32 log-probs of ``targets`` and entropies under softmax(logits / temperature)
    (an empty entropy tensor without ``entropy``)."""
    logits = logits.float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    if not entropy:
        return logprobs, logprobs.new_zeros(0)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        values = log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logprobs, values


def _chunk_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, head: Any, temperature: float, entropy: bool, entropy_grad: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return _from_logits(head(hidden), targets, temperature, entropy, entropy_grad)


def chunked_logprobs(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: Any,
    temperature: float = 1.0,
    *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) at the trainable positions only, ``chunk_tokens`` rows of
    logits at a time, so no (b, L, V) logits tensor (nor a float32 (n, V) one) exists.

    Each chunk computes ``head(hidden)`` in float32, then
    ``log p = z[target] - logsumexp(z)`` (TRL's ``selective_log_softmax``,
    ``trl/trainer/utils.py``: a gather and a logsumexp, never the whole log-softmax) and
    ``H = logsumexp(z) - sum softmax(z) z`` (verl's ``entropy_from_logits_with_chunking``,
    ``verl/utils/torch_functional.py``). With gradients each chunk runs under
    ``torch.utils.checkpoint`` (non-reentrant), so its logits are recomputed in the
    backward pass instead of kept: the memory of the pass is that of one chunk's logits
    whatever n is.

    Args:
        hidden: (n, H) the last layer's states at the positions that predict the targets.
        targets: (n,) int64 token ids.
        head: the output projection (``model.get_output_embeddings()``), (n, H) -> (n, V).
        temperature: logits are divided by it (> 0; 1 leaves them).
        chunk_tokens: rows per chunk (>= 1).
        entropy: compute the entropy (``False``: ``None`` is returned instead; passes
            without gradients need none).
        entropy_grad: let gradients flow through the entropy (``False`` when its
            coefficient is 0: the value is still returned, as a detached statistic).

    Returns:
        ``(logprobs (n,) float32, entropy (n,) float32 or None)``.

    Raises:
        ValueError: ``chunk_tokens`` < 1.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    from torch.utils.checkpoint import checkpoint

    logprobs, entropies = [], []
    grad = torch.is_grad_enabled()
    for start in range(0, hidden.shape[0], chunk_tokens):
        args = (
            hidden[start : start + chunk_tokens],
            targets[start : start + chunk_tokens],
            head,
            temperature,
            entropy,
            entropy_grad,
        )
        lp, h = checkpoint(_chunk_logprobs, *args, use_reentrant=False) if grad else _chunk_logprobs(*args)
        logprobs.append(lp)
        entropies.append(h)
    if not logprobs:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if entropy else None)
    return torch.cat(logprobs), (torch.cat(entropies) if entropy else None)


class Forward(NamedTuple):
    """What :func:`forward_tokens` returns, over b dialogues with n trainable tokens.

    Attributes:
        logprobs: (n,) float32 (see :func:`chunked_logprobs`).
        entropy: (n,) float32, or ``None`` when not asked for.
        hidden: (n, H), the last layer's states at the positions that predict the
            trainable tokens (``None`` unless asked for).
        last_hidden: (b, H), the last layer's state at each dialogue's last position,
            for bootstrapping (``None`` unless asked for).
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor | None
    hidden: torch.Tensor | None = None
    last_hidden: torch.Tensor | None = None


def _last_states(states: torch.Tensor, data: Sequence[TokenData]) -> torch.Tensor:
    """(b, H): each dialogue's state at its last (unpadded) position."""
    ends = torch.tensor([len(d.input_ids) - 1 for d in data], device=states.device)
    return states[torch.arange(len(data), device=states.device), ends]


def split_causal_lm(model: Any) -> tuple[Any, Any] | None:
    """``(backbone, output head)`` of a causal LM (or of a peft model around one): the
    decoder that returns the last hidden states, and the projection to the vocabulary.

    ``None`` when the model cannot be split this way: no ``base_model_prefix`` backbone,
    no output embeddings, or logits that the causal LM post-processes beyond the head
    (Gemma 2's ``final_logit_softcapping``, Cohere's ``logit_scale``), which only its own
    forward applies.
    """
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    prefix = getattr(lm, "base_model_prefix", "")
    backbone = getattr(lm, prefix, None) if prefix else None
    get_head = getattr(lm, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    config = getattr(lm, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    post_processed = any(
        getattr(text, name, None) not in (None, 1.0, 1) for name in ("final_logit_softcapping", "logit_scale")
    )
    if backbone is None or backbone is lm or head is None or post_processed:
        return None
    return backbone, head


def forward_tokens(
    model: Any,
    data: Sequence[TokenData],
    pad_id: int,
    device: torch.device,
    temperature: float,
    hidden: bool = False,
    compute_dtype: torch.dtype | None = None,
    last_hidden: bool = False,
    entropy: bool = True,
    entropy_grad: bool = True,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> Forward:
    """One forward pass over a micro-batch (see :class:`Forward`).

    The backbone runs once and returns its last hidden states; the output head then
    runs only at the n positions that predict trainable tokens, in chunks
    (:func:`chunked_logprobs`), so the (b, L, V) logits of the causal LM's own forward
    are never built. A model that cannot be split (:func:`split_causal_lm`) runs its own
    forward instead and gets the same numbers from its logits.

    Args:
        model: a causal LM or a peft model around one.
        data: the micro-batch.
        pad_id, device, temperature: as the trainer's.
        hidden, last_hidden: also return those states (the shared critic's inputs).
        compute_dtype: ``torch.bfloat16`` runs the model under ``torch.autocast`` in
            that dtype, so float32 master weights compute in half precision.
        entropy, entropy_grad, chunk_tokens: see :func:`chunked_logprobs`.
    """
    ids, attention, targets = collate(data, pad_id, device)
    parts = split_causal_lm(model)
    with torch.autocast(device.type, dtype=compute_dtype or torch.float32, enabled=compute_dtype is not None):
        if parts is None:
            out = model(
                input_ids=ids, attention_mask=attention, output_hidden_states=hidden or last_hidden, use_cache=False
            )
            logprobs, values = token_logprobs(out.logits, ids, targets, temperature)
            values = (values if entropy_grad else values.detach()) if entropy else None
            states = out.hidden_states[-1] if hidden or last_hidden else None
        else:
            backbone, head = parts
            states = backbone(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
            logprobs, values = chunked_logprobs(
                states[:, :-1][targets],
                ids[:, 1:][targets],
                head,
                temperature,
                chunk_tokens=chunk_tokens,
                entropy=entropy,
                entropy_grad=entropy_grad,
            )
    selected = states[:, :-1][targets] if hidden else None
    return Forward(logprobs, values, selected, _last_states(states, data) if last_hidden else None)


def backbone_states(
    backbone: Any,
    data: Sequence[TokenData],
    pad_id: int,
    device: torch.device,
    compute_dtype: torch.dtype | None = None,
    last_hidden: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The last hidden states of a backbone without a language-model head (a separate
    critic: ``AutoModel``, or a peft model around one).

    Returns:
        ``(states (n, H), last (b, H) or None)``: the states at the positions that
        predict the trainable tokens, and with ``last_hidden`` at each dialogue's last
        position (as :class:`Forward`).
    """
    ids, attention, targets = collate(data, pad_id, device)
    with torch.autocast(device.type, dtype=compute_dtype or torch.float32, enabled=compute_dtype is not None):
        states = backbone(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    return states[:, :-1][targets], _last_states(states, data) if last_hidden else None
