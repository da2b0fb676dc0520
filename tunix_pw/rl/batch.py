"""Rollout groups -> the arrays a GRPO update trains on.

A group is one prompt with its G completions and their rewards. Each sample
becomes one row: prompt then completion, right-padded to a fixed length
(so shapes never change), with the completion tokens (stop token included)
as the loss mask, and per row its advantage and weight (0 for the padding
groups dynamic sampling adds at its cap).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from tunix_pw.data import pipeline
from tunix_pw.rl import rewards as rewards_lib
from tunix_pw.runtime.fetch import fetch


@dataclasses.dataclass
class Group:
  prompt: list[int]
  answer: str
  completions: list[list[int]]  # G token lists (through the stop token)
  truncated: list[bool]
  rewards: np.ndarray  # [G] total
  per_reward: dict[str, np.ndarray]  # name -> [G]
  logprobs: list[list[float]]  # G: the rollout engine's, per token
  dataset: str = ''  # a mixture's dataset name ('' without a mixture)
  # Per completion token, 1 where the loss applies; None: all of them (an
  # agent's episode trains on its model turns, not on the tool results).
  masks: list[list[int]] | None = None

  @property
  def informative(self) -> bool:
    """Rewards that differ: a group of equal rewards has no advantage."""
    return bool(np.ptp(self.rewards) > 0)


def to_arrays(groups: Sequence[Group], weights: Sequence[float],
              length: int, pad_id: int,
              advantage: Callable | None) -> dict[str, np.ndarray]:
  """tokens, loss_mask, segment_ids, positions [N, length]; weights and
  (given an `advantage` of the group rewards) advantages [N] (N = groups x
  G)."""
  rows, row_weights = [], []
  for group, weight in zip(groups, weights):
    for i, completion in enumerate(group.completions):
      rows.append(dict(tokens=group.prompt + completion,
                       loss_mask=[0] * len(group.prompt) + (
                           group.masks[i] if group.masks
                           else [1] * len(completion))))
      row_weights.append(weight)
  out = dict(pipeline.pad_batch(rows, length, pad_id),
             weights=np.asarray(row_weights, np.float32))
  if advantage is not None:
    rewards = np.stack([g.rewards for g in groups])  # [P, G]
    out['advantages'] = np.asarray(advantage(jnp.asarray(
        rewards))).reshape(-1).astype(np.float32)
  return out


def rollout_logps(groups: Sequence[Group], length: int) -> np.ndarray:
  """[N, length - 1]: the rollout engine's log-probability of each next
  token, laid out like the trainer's (`loss.token_logps`): the completion
  token at position p is predicted at p - 1."""
  out = np.zeros((sum(len(g.completions) for g in groups), length - 1),
                 np.float32)
  row = 0
  for group in groups:
    for logprobs in group.logprobs:
      start = len(group.prompt) - 1
      out[row, start:start + len(logprobs)] = logprobs
      row += 1
  return out


@dataclasses.dataclass(frozen=True)
class Scorers:
  """Models that score every sample of a round for the rewards: a reward
  model, of prompt + completion ids (`model_score`); an LLM judge, of the
  texts, with its count of malformed answers (`judge_score`)."""

  reward_model: Callable[[list[list[int]]], np.ndarray] | None = None
  judge: Callable[[list[str], list[str]], tuple[np.ndarray, int]] | None = None

  def __call__(self, prompt_ids: list[list[int]],
               completion_ids: list[list[int]], prompts: list[str],
               completions: list[str],
               counts: dict[str, int]) -> list[dict[str, float]]:
    """Each row's Sample fields; the judge's malformed answers counted."""
    fields = [{} for _ in prompt_ids]
    if self.reward_model:
      scores = self.reward_model([p + c for p, c in zip(prompt_ids,
                                                          completion_ids)])
      for row, score in zip(fields, scores):
        row['model_score'] = float(score)
    if self.judge:
      scores, malformed = self.judge(prompts, completions)
      counts['judge_malformed'] = counts.get('judge_malformed', 0) + malformed
      for row, score in zip(fields, scores):
        row['judge_score'] = float(score)
    return fields


def rollout(sampler: Any, data: Iterator[list[dict[str, Any]]],
            tokenizer: Any, rl: Any, weights: dict[str, Any],
            sampling: Callable[[int], Any], scorers: Scorers = Scorers()
            ) -> tuple[list[Group], list[float], dict[str, int]]:
  """Groups for one step: generate, score (with the reward weights of each
  prompt's dataset: `weights[prompt.get('dataset', '')]`), and with
  dynamic sampling drop
  groups of equal rewards and refill from new prompts, up to
  `refill_rounds`; short of groups at the cap, the last group repeats with
  weight 0. `sampling(round)` gives each round's settings; `scorers`, the
  model-based scores the rewards read. Returns (groups, group weights,
  counts)."""
  kept, counts = [], dict(dropped=0, padded=0, rounds=0, reward_errors=0,
                          generated=0)
  while True:
    prompts = next(data)
    rows_prompts = [p['prompt'] for p in prompts
                    for _ in range(rl.num_generations)]
    out = sampler.generate(rows_prompts, sampling(counts['rounds']))
    tokens, logprobs, lengths = fetch((out.tokens, out.logprobs,
                                       out.lengths))
    counts['generated'] += int(lengths.sum())
    every = [tokens[r, :lengths[r]].tolist() for r in range(len(tokens))]
    texts = [tokenizer.decode([t for t in c if t not in tokenizer.stop_ids])
             for c in every]
    prompt_texts = [tokenizer.decode(ids) for ids in rows_prompts]
    fields = scorers(rows_prompts, every, prompt_texts, texts, counts)
    for i, prompt in enumerate(prompts):
      rows = range(i * rl.num_generations, (i + 1) * rl.num_generations)
      completions = [every[r] for r in rows]
      completion_logprobs = [logprobs[r, :lengths[r]].tolist() for r in rows]
      truncated = [not c or c[-1] not in tokenizer.stop_ids
                   for c in completions]
      samples = [rewards_lib.Sample(
          prompt=prompt_texts[r], completion=texts[r],
          answer=prompt['answer'], length=len(c), budget=rl.max_new_tokens,
          truncated=t, **fields[r])
                 for r, c, t in zip(rows, completions, truncated)]
      dataset = prompt.get('dataset', '')
      total, per_fn, errors = rewards_lib.score(samples, weights[dataset],
                                                rl.strict_rewards)
      counts['reward_errors'] += errors
      group = Group(prompt['prompt'], prompt['answer'], completions,
                    truncated, total, per_fn, completion_logprobs, dataset)
      if rl.dynamic_sampling and not group.informative:
        counts['dropped'] += 1
        continue
      kept.append(group)
    if (not rl.dynamic_sampling or len(kept) >= rl.prompts_per_step or
        counts['rounds'] >= rl.refill_rounds):
      break
    counts['rounds'] += 1
  kept = kept[:rl.prompts_per_step]
  group_weights = [1.0] * len(kept)
  while len(kept) < rl.prompts_per_step:  # static shapes: zero-weight filler
    kept.append(kept[-1] if kept else group)
    group_weights.append(0.0)
    counts['padded'] += 1
  return kept, group_weights, counts
