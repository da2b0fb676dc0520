"""Rollout groups -> the arrays a GRPO update trains on.

A group is one prompt with its G completions and their rewards. Each sample
becomes one row: prompt then completion, right-padded to a fixed length
(so shapes never change), with the completion tokens (stop token included)
as the loss mask, and per row its advantage and weight (0 for the padding
groups dynamic sampling adds at its cap).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass
class Group:
  prompt: list[int]
  answer: str
  completions: list[list[int]]  # G token lists (through the stop token)
  truncated: list[bool]
  rewards: np.ndarray  # [G] total
  per_reward: dict[str, np.ndarray]  # name -> [G]

  @property
  def informative(self) -> bool:
    """Rewards that differ: a group of equal rewards has no advantage."""
    return bool(np.ptp(self.rewards) > 0)


def to_arrays(groups: Sequence[Group], weights: Sequence[float],
              length: int, pad_id: int,
              advantage: Callable) -> dict[str, np.ndarray]:
  """tokens, loss_mask, segment_ids, positions [N, length]; advantages,
  weights [N] (N = groups x G)."""
  rows, masks, row_weights = [], [], []
  for group, weight in zip(groups, weights):
    for completion in group.completions:
      rows.append(group.prompt + completion)
      masks.append([0] * len(group.prompt) + [1] * len(completion))
      row_weights.append(weight)
  n = len(rows)
  tokens = np.full((n, length), pad_id, np.int32)
  loss_mask = np.zeros((n, length), np.int32)
  segments = np.zeros((n, length), np.int32)
  for i, (row, mask) in enumerate(zip(rows, masks)):
    tokens[i, :len(row)], loss_mask[i, :len(row)], segments[i, :len(row)] = (
        row, mask, 1)
  rewards = np.stack([g.rewards for g in groups])  # [P, G]
  advantages = np.asarray(advantage(jnp.asarray(rewards))).reshape(-1)
  return dict(tokens=tokens, loss_mask=loss_mask, segment_ids=segments,
              positions=np.broadcast_to(np.arange(length, dtype=np.int32),
                                        (n, length)) * segments,
              advantages=advantages.astype(np.float32),
              weights=np.asarray(row_weights, np.float32))
