"""From trajectories to training tensors, and log-probs from a forward pass.

Every per-token quantity of the update (log-probs, values, rewards, advantages) lives
in *flat* form: one 1-D tensor per trajectory holding only its trainable tokens (the
ones the policy sampled), in order. Losses are then plain means over flat vectors, and
GAE over the flat sequence is GAE over trainable tokens only (the user's turns never
dilute it).
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
        bootstrap: the dialogue was cut at the context limit, not ended: its return
            continues past the last token, so PPO bootstraps from the value of the last
            position (the state after the last turn).
    """

    input_ids: torch.Tensor
    target_mask: torch.Tensor
    turn_rewards: torch.Tensor
    turn_index: torch.Tensor
    bootstrap: bool = False

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
        turn_index[previous_end + 1:last + 1] = turn
        previous_end = last
    return TokenData(ids, mask, rewards, turn_index, bootstrap=trajectory.cut)


def pad_flat(values: Sequence[torch.Tensor], fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D tensors of different lengths: ``(padded (N, n_max), valid (N, n_max) bool)``."""
    width = max((len(v) for v in values), default=0)
    padded = torch.full((len(values), width), fill, dtype=values[0].dtype if values else torch.float32)
    valid = torch.zeros((len(values), width), dtype=torch.bool)
    for row, v in enumerate(values):
        padded[row, :len(v)] = v
        valid[row, :len(v)] = True
    return padded, valid


def unpad_flat(padded: torch.Tensor, valid: torch.Tensor) -> list[torch.Tensor]:
    """The inverse of :func:`pad_flat`."""
    return [row[mask] for row, mask in zip(padded, valid)]


def collate(data: Sequence[TokenData], pad_id: int, device: torch.device
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad a micro-batch: ``input_ids (b, L)``, ``attention_mask (b, L)``,
    ``target_mask (b, L-1)`` (False on padding), on ``device``."""
    width = max(len(d.input_ids) for d in data)
    ids = torch.full((len(data), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(data), width), dtype=torch.long)
    targets = torch.zeros((len(data), width - 1), dtype=torch.bool)
    for row, d in enumerate(data):
        ids[row, :len(d.input_ids)] = d.input_ids
        attention[row, :len(d.input_ids)] = 1
        targets[row, :len(d.target_mask)] = d.target_mask
    return ids.to(device), attention.to(device), targets.to(device)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, target_mask: torch.Tensor,
                   temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability and entropy of the policy at the trainable tokens.

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
    selected = logits[:, :-1][target_mask].float()
    if temperature > 0 and temperature != 1.0:
        selected = selected / temperature
    targets = input_ids[:, 1:][target_mask]
    log_z = torch.logsumexp(selected, dim=-1)
    logprobs = selected.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_z
    entropy = log_z - (torch.softmax(selected, dim=-1) * selected).sum(-1)
    return logprobs, entropy


def split_flat(flat: torch.Tensor, counts: Sequence[int]) -> list[torch.Tensor]:
    """Split a concatenation of per-trajectory flat tensors back into pieces."""
    return list(torch.split(flat, list(counts)))


class Forward(NamedTuple):
    """What :func:`forward_tokens` returns, over a micro-batch of b dialogues with n
    trainable tokens in all.

    Attributes:
        logprobs, entropy: (n,) float32 (see :func:`token_logprobs`).
        hidden: (n, H), the last layer's states at the positions that predict the
            trainable tokens (``None`` unless asked for).
        last_hidden: (b, H), the last layer's state at each dialogue's last position:
            the state after its last turn, for bootstrapping (``None`` unless asked for).
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor
    hidden: torch.Tensor | None = None
    last_hidden: torch.Tensor | None = None


def forward_tokens(model: Any, data: Sequence[TokenData], pad_id: int, device: torch.device,
                   temperature: float, hidden: bool = False, compute_dtype: torch.dtype | None = None,
                   last_hidden: bool = False) -> Forward:
    """One forward pass over a micro-batch (see :class:`Forward`).

    ``compute_dtype`` (``torch.bfloat16``): run the model under ``torch.autocast`` in that
    dtype, so float32 master weights compute in half precision (mixed precision)."""
    ids, attention, targets = collate(data, pad_id, device)
    states_wanted = hidden or last_hidden
    with torch.autocast(device.type, dtype=compute_dtype or torch.float32, enabled=compute_dtype is not None):
        out = model(input_ids=ids, attention_mask=attention, output_hidden_states=states_wanted,
                    use_cache=False)
    logprobs, entropy = token_logprobs(out.logits, ids, targets, temperature)
    states = out.hidden_states[-1][:, :-1][targets] if hidden else None
    last = None
    if last_hidden:
        ends = torch.tensor([len(d.input_ids) - 1 for d in data], device=ids.device)
        last = out.hidden_states[-1][torch.arange(len(data), device=ids.device), ends]
    return Forward(logprobs, entropy, states, last)
