"""Held-out evaluation: greedy exact match through the rollout engine."""

from __future__ import annotations

from collections.abc import Sequence
import math

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
                batch_size: int) -> list[str]:
  """Greedy completions (decoded, up to the stop token) for every prompt."""
  greedy = SamplingConfig(max_new_tokens=max_new_tokens, greedy=True)
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
