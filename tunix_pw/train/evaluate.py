"""Held-out evaluation through the rollout engine: greedy exact match, and
with k samples per problem pass@k (any sample right) and maj@k (the most
common answer right), on one or several named held-out sets."""

from __future__ import annotations

import collections
from collections.abc import Sequence
import math

import numpy as np

from tunix_pw.models.tokenizers import Tokenizer
from tunix_pw.runtime.fetch import fetch
from tunix_pw.sampling.rollout import RolloutEngine, SamplingConfig


def wilson_interval(correct: int, total: int,
                    z: float = 1.96) -> tuple[float, float]:
  """The 95% Wilson score interval of a proportion."""
  if not total:
    return 0.0, 0.0
  p = correct / total
  centre = (p + z * z / (2 * total)) / (1 + z * z / total)
  half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (
      1 + z * z / total)
  return max(0.0, centre - half), min(1.0, centre + half)


def completions(engine: RolloutEngine, tokenizer: Tokenizer,
                prompts: Sequence[Sequence[int]], max_new_tokens: int,
                batch_size: int,
                sampling: SamplingConfig | None = None) -> list[str]:
  """Completions (decoded, up to the stop token) for every prompt: greedy,
  or drawn with `sampling`."""
  greedy = sampling or SamplingConfig(max_new_tokens=max_new_tokens,
                                      greedy=True)
  texts = []
  for start in range(0, len(prompts), batch_size):
    chunk = list(prompts[start:start + batch_size])
    padded = chunk + [chunk[-1]] * (batch_size - len(chunk))  # one shape
    out = engine.generate(padded, greedy)
    tokens, lengths = fetch((out.tokens, out.lengths))
    for row in range(len(chunk)):
      ids = [t for t in tokens[row, :lengths[row]]
             if t not in tokenizer.stop_ids]
      texts.append(tokenizer.decode(ids))
  return texts


def exact_match(engine: RolloutEngine, tokenizer: Tokenizer,
                prompts: Sequence[Sequence[int]], answers: Sequence[str],
                max_new_tokens: int, batch_size: int) -> dict[str, float]:
  texts = completions(engine, tokenizer, prompts, max_new_tokens, batch_size)
  correct = sum(t.strip() == a.strip() for t, a in zip(texts, answers))
  low, high = wilson_interval(correct, len(answers))
  return dict(accuracy=correct / max(len(answers), 1), correct=correct,
              total=len(answers), ci_low=low, ci_high=high)


def summary(job: str, result: dict[str, float]) -> str:
  """The line a job prints about its held-out accuracy."""
  return (f'{job}: held-out greedy exact match {result["eval/accuracy"]:.1%} '
          f'({int(result["eval/correct"])}/{int(result["eval/total"])}, '
          f'95% CI {result["eval/ci_low"]:.1%}-{result["eval/ci_high"]:.1%})')


def pass_at_k(correct: np.ndarray) -> float:
  """[P, k] booleans -> the fraction of problems with a right sample."""
  return float(np.mean(np.any(correct, axis=1))) if len(correct) else 0.0


def maj_at_k(samples: Sequence[Sequence[str]],
             answers: Sequence[str]) -> float:
  """The fraction of problems whose most common answer (stripped; a tie
  goes to the answer seen first) is right."""
  right = 0
  for texts, answer in zip(samples, answers):
    votes = collections.Counter(t.strip() for t in texts)
    top = max(votes.values())
    winner = next(t.strip() for t in texts if votes[t.strip()] == top)
    right += winner == answer.strip()
  return right / max(len(answers), 1)


def sampled(engine: RolloutEngine, tokenizer: Tokenizer,
            prompts: Sequence[Sequence[int]], answers: Sequence[str], k: int,
            sampling: SamplingConfig, batch_size: int) -> dict[str, float]:
  """pass@k and maj@k from k samples per problem."""
  repeated = [p for p in prompts for _ in range(k)]
  texts = completions(engine, tokenizer, repeated, sampling.max_new_tokens,
                      batch_size, sampling)
  samples = [texts[i * k:(i + 1) * k] for i in range(len(prompts))]
  correct = np.array([[t.strip() == a.strip() for t in row]
                      for row, a in zip(samples, answers)]).reshape(-1, k)
  return {f'pass@{k}': pass_at_k(correct), f'maj@{k}': maj_at_k(samples,
                                                                answers)}
