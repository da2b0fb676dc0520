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
from tunix_pw.sampling import tree as tree_lib


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
  # Per completion token, the version of the weights that produced it (an
  # engine that takes new weights mid-generation); None: not recorded.
  versions: list[list[int]] | None = None
  # Per completion token, its advantage from a tree rollout's structure
  # (sampling/tree.py); None: the group advantage of the rewards.
  token_advantages: list[list[float]] | None = None
  # The prompt's images [N, C, H, W] (a vision-language model's); None:
  # a text prompt.
  images: np.ndarray | None = None

  @property
  def informative(self) -> bool:
    """Rewards that differ: a group of equal rewards has no advantage."""
    return bool(np.ptp(self.rewards) > 0)


def to_arrays(groups: Sequence[Group], weights: Sequence[float],
              length: int, pad_id: int,
              advantage: Callable | None) -> dict[str, np.ndarray]:
  """tokens, loss_mask, segment_ids, positions [N, length]; weights and
  advantages: a tree rollout's per token [N, length - 1], else (given an
  `advantage` of the group rewards) [N] (N = groups x G)."""
  rows, row_weights = [], []
  for group, weight in zip(groups, weights):
    for i, completion in enumerate(group.completions):
      rows.append(dict(tokens=group.prompt + completion,
                       loss_mask=[0] * len(group.prompt) + (
                           group.masks[i] if group.masks
                           else [1] * len(completion)),
                       **({} if group.images is None
                          else {'images': group.images})))
      row_weights.append(weight)
  out = dict(pipeline.pad_batch(rows, length, pad_id),
             weights=np.asarray(row_weights, np.float32))
  if groups[0].token_advantages is not None:
    out['advantages'] = per_token(groups, length, 'token_advantages')
  elif advantage is not None:
    rewards = np.stack([g.rewards for g in groups])  # [P, G]
    out['advantages'] = np.asarray(advantage(jnp.asarray(
        rewards))).reshape(-1).astype(np.float32)
  return out


def rollout_logps(groups: Sequence[Group], length: int) -> np.ndarray:
  """[N, length - 1]: the rollout engine's log-probability of each next
  token, laid out like the trainer's (`loss.token_logps`)."""
  return per_token(groups, length, 'logprobs')


def per_token(groups: Sequence[Group], length: int, field: str
              ) -> np.ndarray:
  """[N, length - 1]: a per-completion-token field of the groups, laid
  out like the trainer's log-probabilities: the completion token at
  position p is predicted at p - 1."""
  out = np.zeros((sum(len(g.completions) for g in groups), length - 1),
                 np.float32)
  row = 0
  for group in groups:
    for values in getattr(group, field):
      start = len(group.prompt) - 1
      out[row, start:start + len(values)] = values
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
            ) -> Callable[[], tuple[list[Group], list[float], dict[str, int]]]:
  """Groups for one step, in two stages: this call generates, the function
  it returns scores (with the reward weights of each prompt's dataset:
  `weights[prompt.get('dataset', '')]`) and returns (groups, group weights,
  counts), so that a slow verifier can overlap the next generation. Dynamic
  sampling scores here (it refills on scores): it drops groups of equal
  rewards and refills from new prompts, up to `refill_rounds`; short of
  groups at the cap, the last group repeats with weight 0.
  `sampling(round)` gives each round's settings; `scorers`, the model-based
  scores the rewards read."""
  counts = dict(dropped=0, padded=0, rounds=0, reward_errors=0, generated=0)
  generated = _generate(sampler, next(data), rl, sampling(0), counts)
  if not rl.dynamic_sampling:
    return lambda: _fill(
        _score(generated, tokenizer, rl, weights, scorers, counts), rl,
        counts)
  kept = []
  while True:
    groups = _score(generated, tokenizer, rl, weights, scorers, counts)
    informative = [g for g in groups if g.informative]
    counts['dropped'] += len(groups) - len(informative)
    kept += informative
    if len(kept) >= rl.prompts_per_step or counts['rounds'] >= (
        rl.refill_rounds):
      break
    counts['rounds'] += 1
    generated = _generate(sampler, next(data), rl,
                          sampling(counts['rounds']), counts)
  result = _fill(kept, rl, counts, filler=groups[-1])
  return lambda: result


@dataclasses.dataclass(frozen=True)
class _Generated:
  """One round's completions, as the sampler returned them."""

  prompts: list[dict[str, Any]]
  rows_prompts: list[list[int]]  # each prompt's ids, once per generation
  completions: list[list[int]]  # through the stop token
  logprobs: list[list[float]]
  versions: list[list[int]] | None  # per token, when the engine records it
  tree: tree_lib.Tree | None = None  # a tree rollout's structure


def _generate(sampler: Any, prompts: list[dict[str, Any]], rl: Any,
              sampling: Any, counts: dict[str, int]) -> _Generated:
  rows_prompts = [p['prompt'] for p in prompts
                  for _ in range(rl.num_generations)]
  sampling = dataclasses.replace(sampling, generations=rl.num_generations)
  grown = None
  if rl.tree.chains:
    grown = sampler.generate_tree([p['prompt'] for p in prompts], sampling,
                                  tree_lib.TreeShape.from_block(rl.tree))
    out = grown.completions
  else:
    out = sampler.generate([p['prompt'] for p in prompts], sampling,
                           **({'images': [p['images'] for p in prompts]}
                              if 'images' in prompts[0] else {}))
  tokens, logprobs, lengths = fetch((out.tokens, out.logprobs, out.lengths))
  decoded = grown.decoded() if grown else int(lengths.sum())
  counts['generated'] += decoded
  if grown:  # tokens shared with a branch's ancestors, not decoded again
    counts['tree_shared'] = counts.get('tree_shared', 0) + int(
        lengths.sum()) - decoded
  if out.log_kept is not None and (sampling.top_k or sampling.top_p < 1):
    # nats top-k/top-p cut from the policy, over the generated tokens
    counts['truncated_nats'] = counts.get('truncated_nats', 0.0) - float(
        np.sum(np.where(np.asarray(fetch(out.mask)), fetch(out.log_kept),
                        0.0)))
  rows = lambda x: [x[r, :n].tolist() for r, n in enumerate(lengths)]
  return _Generated(prompts, rows_prompts, rows(tokens), rows(logprobs),
                    None if out.versions is None else rows(out.versions),
                    grown)


def _score(generated: _Generated, tokenizer: Any, rl: Any,
           weights: dict[str, Any], scorers: Scorers,
           counts: dict[str, int]) -> list[Group]:
  """A round's groups, each sample scored by its dataset's rewards."""
  every = generated.completions
  texts = [tokenizer.decode([t for t in c if t not in tokenizer.stop_ids])
           for c in every]
  prompt_texts = [tokenizer.decode(ids) for ids in generated.rows_prompts]
  fields = scorers(generated.rows_prompts, every, prompt_texts, texts, counts)
  groups = []
  for i, prompt in enumerate(generated.prompts):
    rows = range(i * rl.num_generations, (i + 1) * rl.num_generations)
    completions = [every[r] for r in rows]
    truncated = [not c or c[-1] not in tokenizer.stop_ids
                 for c in completions]
    samples = [rewards_lib.Sample(
        prompt=prompt_texts[r], completion=texts[r], answer=prompt['answer'],
        length=len(c), budget=rl.max_new_tokens, truncated=t, **fields[r])
               for r, c, t in zip(rows, completions, truncated)]
    dataset = prompt.get('dataset', '')
    total, per_fn, errors = rewards_lib.score(samples, weights[dataset],
                                              rl.strict_rewards)
    counts['reward_errors'] += errors
    groups.append(Group(
        prompt['prompt'], prompt['answer'], completions, truncated, total,
        per_fn, [generated.logprobs[r] for r in rows], dataset,
        versions=generated.versions and [generated.versions[r]
                                         for r in rows],
        images=prompt.get('images')))
  if generated.tree:
    t = rl.tree
    advantages = tree_lib.advantages(
        generated.tree, np.concatenate([g.rewards for g in groups]),
        rl.num_generations, t.segment, t.local_weight, t.global_weight,
        t.by_leaves)
    for i, group in enumerate(groups):
      group.token_advantages = [
          advantages[i * rl.num_generations + j, :len(c)].tolist()
          for j, c in enumerate(group.completions)]
  return groups


def _fill(kept: list[Group], rl: Any, counts: dict[str, int],
          filler: Group | None = None
          ) -> tuple[list[Group], list[float], dict[str, int]]:
  """The step's `prompts_per_step` groups: `kept`, then (static shapes)
  its last group (or `filler`) repeated with weight 0."""
  kept = kept[:rl.prompts_per_step]
  group_weights = [1.0] * len(kept)
  while len(kept) < rl.prompts_per_step:
    kept.append(kept[-1] if kept else filler)
    group_weights.append(0.0)
    counts['padded'] += 1
  return kept, group_weights, counts
