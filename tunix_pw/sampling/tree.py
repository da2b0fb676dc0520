"""Tree-structured rollouts: branch where the policy is uncertain and share
the prefixes.

A prompt's `generations` rows are a budget of slots. `chains` of them
decode from the prompt; after every `segment` tokens, the `branches` live
chains whose last segment was the most surprising (the highest mean
-log p of their sampled tokens) each fork `forks` times into unused
slots. A fork copies its parent's state, KV cache included (a slot copy,
nothing recomputed), and continues with random numbers of its own. Every
slot's tokens are a complete completion (its prefix copied from its
ancestors), so the rewards and the RL phases see ordinary rows; the tree
(`parent`, `born`) says which tokens were decoded once and shared.
Branching at segment boundaries is TreePO's decoding (arXiv 2508.17445),
guided by uncertainty as TreeRL's EPTree (arXiv 2506.11902) is; at equal
slots a tree never decodes more tokens than as many independent chains.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tunix_pw.errors import UsageError
from tunix_pw.sampling.rollout import Completions


@dataclasses.dataclass(frozen=True)
class TreeShape:
  chains: int  # chains per prompt decoded from the prompt
  segment: int  # tokens between branch points
  branches: int  # live chains per prompt that fork at a branch point
  forks: int  # new chains each of them starts there

  @classmethod
  def from_block(cls, block) -> 'TreeShape':
    """From a config's `rl.tree` block."""
    return cls(block.chains, block.segment, block.branches, block.forks)

  def check(self, generations: int, field: str = '--config.rl.tree') -> None:
    if generations < 2:
      raise UsageError(f'a tree needs at least 2 generations per prompt to '
                       f'branch into; there are {generations}.')
    if not 1 <= self.chains <= generations:
      raise UsageError(f'{field}.chains={self.chains} must be from 1 to the '
                       f'{generations} generations per prompt (its slots).')
    for name in ('segment', 'branches', 'forks'):
      if getattr(self, name) < 1:
        raise UsageError(f'{field}.{name}={getattr(self, name)} must be at '
                         'least 1.')


@dataclasses.dataclass(frozen=True)
class Tree:
  """A tree rollout's rows, prompt-major like `generate`'s: every row a
  leaf's whole completion."""

  completions: Completions
  parent: np.ndarray  # [R] the row it forked from (-1: from the prompt)
  born: np.ndarray  # [R] the completion index where its own tokens begin
  active: np.ndarray  # [R] whether the row was used (unused slots: no tokens)

  def decoded(self) -> int:
    """Tokens decoded: each shared prefix once."""
    lengths = np.asarray(self.completions.lengths)
    return int((np.maximum(lengths - self.born, 0) * self.active).sum())


def roots(prompts: int, generations: int, chains: int) -> np.ndarray:
  """[prompts x generations] True for the first `chains` slots of each
  prompt: the chains decoded from the prompt."""
  return np.tile(np.arange(generations) < chains, prompts)


def layout(active: np.ndarray, generations: int) -> np.ndarray:
  """The decode batch for the used rows of a tree: per prompt, its used
  rows in order, padded (-1) to one count for every prompt, a power of
  two of at least 2 (a one-row batch's cache drops its batch axis; few
  distinct batch shapes compile). Returns each batch row's row of the
  tree."""
  used = active.reshape(-1, generations)
  width = max(2, 1 << (int(used.sum(1).max()) - 1).bit_length())
  out = np.full((len(used), width), -1)
  for prompt, flags in enumerate(used):
    rows = np.flatnonzero(flags) + prompt * generations
    out[prompt, :len(rows)] = rows
  return out.ravel()


def surprisal(logprobs: np.ndarray, lengths: np.ndarray, start: int,
              end: int) -> np.ndarray:
  """Each row's mean -log p over its tokens in [start, end) (0: none)."""
  counts = np.clip(lengths - start, 0, end - start)
  total = -logprobs[:, start:end].sum(axis=1)
  return np.where(counts > 0, total / np.maximum(counts, 1), 0.0)


def branch(shape: TreeShape, generations: int, active: np.ndarray,
           done: np.ndarray, uncertainty: np.ndarray) -> np.ndarray:
  """Row -> the row whose state it takes at a branch point: per prompt,
  the `branches` live chains of highest `uncertainty` fork `forks` times
  each into unused slots, while there are any; other rows keep theirs."""
  source = np.arange(len(active))
  for first in range(0, len(active), generations):
    group = range(first, first + generations)
    free = [r for r in group if not active[r]]
    live = sorted((r for r in group if active[r] and not done[r]),
                  key=lambda r: -uncertainty[r])
    for r in live[:shape.branches]:
      for _ in range(shape.forks):
        if free:
          source[free.pop(0)] = r
  return source


def owners(parent: np.ndarray, born: np.ndarray, length: int) -> np.ndarray:
  """[R, length]: the row that decoded each row's token t (itself from
  `born` on, an ancestor before)."""
  out = np.tile(np.arange(len(parent))[:, None], (1, length))
  t = np.arange(length)[None]
  for _ in range(len(parent)):  # at most one step up per ancestor
    up = born[out] > t
    if not up.any():
      break
    out = np.where(up, parent[out], out)
  return out


def advantages(tree: Tree, rewards: np.ndarray, generations: int,
               segment: int, local: float = 1.0, global_: float = 1.0,
               by_leaves: bool = True) -> np.ndarray:
  """Per-token advantages [R, N] from the tree (TreeRL's, arXiv
  2506.11902, eq. 3-5): a token's node is its segment of the chain that
  decoded it, V(node) the mean reward of the leaves below it (the rows
  that share that token), and its advantage `global_` x (V(node) -
  V(root)) + `local` x (V(node) - V(parent node)), the root being the
  prompt's (the mean of its used rows) and a first segment's parent the
  root; with `by_leaves`, divided by sqrt(the node's leaves), since a
  shared token is trained once per leaf. Unused rows and tokens past a
  row's end get 0."""
  lengths = np.asarray(tree.completions.lengths)
  n = np.asarray(tree.completions.tokens).shape[1]
  # [prompts, G, N] each: the token's decoding row, whether it exists.
  owner = owners(tree.parent, tree.born, n).reshape(-1, generations, n)
  present = ((np.arange(n)[None] < lengths[:, None]) &
             tree.active[:, None]).reshape(owner.shape)
  reward = rewards.reshape(-1, generations)
  # shared[p, i, j, t]: rows i and j share token t (j has it).
  shared = (owner[:, :, None] == owner[:, None]) & present[:, None]
  leaves = shared.sum(2)
  value = (shared * reward[:, None, :, None]).sum(2) / np.maximum(leaves, 1)
  used = tree.active.reshape(reward.shape)
  root = ((reward * used).sum(1) / np.maximum(used.sum(1), 1))[:, None, None]
  start = np.arange(n) - np.arange(n) % segment  # each token's segment
  parent = np.where(start > 0, value[..., np.maximum(start - 1, 0)], root)
  out = global_ * (value - root) + local * (value - parent)
  if by_leaves:
    out = out / np.sqrt(np.maximum(leaves, 1))
  return np.where(present, out, 0.0).reshape(len(rewards), n).astype(
      np.float32)
