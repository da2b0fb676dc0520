"""Held-out evaluation through the rollout engine: greedy accuracy, and
with n >= k samples per problem pass@k (the unbiased estimate of a right
answer among k samples, Chen et al. 2021) and maj@k (the most common
answer of k samples right), on one or several named held-out sets.

A completion is judged by a `Verifier`, the extraction and equivalence of
the job's reward (rl/rewards.py): a completion that reasons before its
answer counts, and votes are over answers, not texts."""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
import dataclasses
import math
from typing import Any

import numpy as np

from tunix_pw import registry
from tunix_pw.errors import UsageError
from tunix_pw.models.tokenizers import Tokenizer
from tunix_pw.runtime.fetch import fetch
from tunix_pw.sampling.rollout import RolloutEngine, SamplingConfig


@dataclasses.dataclass(frozen=True)
class Verifier:
  """How a completion is judged against its reference: held-out
  evaluation, agent environments and the rewards named like it all ask
  one (registered: `--config.eval_verifier`, `verifier`,
  `agent.verifier`)."""

  answer: Callable[[str], Any]  # a completion's answer (a vote), or None
  right: Callable[[str, str], bool]  # (completion, reference) -> right?
  # (completion, reference) -> the word on a wrong one (a retry's
  # {feedback}); by default 'no answer' or 'wrong'.
  words: Callable[[str, str], str] | None = None

  def verdict(self, text: str, reference: str) -> tuple[bool, str]:
    """(right?, the word on a wrong answer)."""
    if self.right(text, reference):
      return True, ''
    if self.words:
      return False, self.words(text, reference)
    return False, 'no answer' if self.answer(text) is None else 'wrong'


EXACT = registry.register('verifier', 'exact')(Verifier(
    str.strip, lambda text, answer: text.strip() == answer.strip()))


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
                batch_size: int, sampling: SamplingConfig | None = None,
                images: Sequence[Any] | None = None) -> list[str]:
  """Completions (decoded, up to the stop token) for every prompt: greedy,
  or drawn with `sampling`; `images`: each prompt's (a vision-language
  model's)."""
  greedy = sampling or SamplingConfig(max_new_tokens=max_new_tokens,
                                      greedy=True)
  texts = []
  for start in range(0, len(prompts), batch_size):
    chunk = list(prompts[start:start + batch_size])
    padded = chunk + [chunk[-1]] * (batch_size - len(chunk))  # one shape
    if images is None:
      out = engine.generate(padded, greedy)
    else:
      own = list(images[start:start + batch_size])
      out = engine.generate(padded, greedy,
                            images=own + [own[-1]] * (batch_size - len(own)))
    tokens, lengths = fetch((out.tokens, out.lengths))
    for row in range(len(chunk)):
      ids = [t for t in tokens[row, :lengths[row]]
             if t not in tokenizer.stop_ids]
      texts.append(tokenizer.decode(ids))
  return texts


def exact_match(engine: RolloutEngine, tokenizer: Tokenizer,
                prompts: Sequence[Sequence[int]], answers: Sequence[str],
                max_new_tokens: int, batch_size: int,
                verifier: Verifier = EXACT,
                images: Sequence[Any] | None = None) -> dict[str, float]:
  """Greedy accuracy: the share of prompts whose completion `verifier`
  finds right, with its 95% interval."""
  texts = completions(engine, tokenizer, prompts, max_new_tokens, batch_size,
                      images=images)
  correct = sum(verifier.right(t, a) for t, a in zip(texts, answers))
  low, high = wilson_interval(correct, len(answers))
  return dict(accuracy=correct / max(len(answers), 1), correct=correct,
              total=len(answers), ci_low=low, ci_high=high)


def summary(job: str, result: dict[str, float]) -> str:
  """The line a job prints about an evaluation: its held-out accuracy, or
  (a loss or pairs evaluation) its eval/ metrics."""
  if 'eval/accuracy' not in result:
    return f'{job}: held-out ' + ', '.join(
        f'{k[5:]}={v:.4g}' for k, v in result.items() if k.startswith('eval/'))
  return (f'{job}: held-out greedy exact match {result["eval/accuracy"]:.1%} '
          f'({int(result["eval/correct"])}/{int(result["eval/total"])}, '
          f'95% CI {result["eval/ci_low"]:.1%}-{result["eval/ci_high"]:.1%})')


def pass_at_k(right: np.ndarray, k: int) -> float:
  """[P, n] booleans (n >= k samples per problem) -> the mean over problems
  of 1 - C(n - c, k) / C(n, k), c right: the unbiased estimate of the
  chance that k samples hold a right one (Chen et al. 2021)."""
  if not len(right):
    return 0.0
  n = right.shape[1]
  return float(np.mean([1.0 - math.comb(n - c, k) / math.comb(n, k)
                        for c in right.sum(axis=1)]))


def maj_at_k(samples: Sequence[Sequence[str]], answers: Sequence[str],
             verifier: Verifier, k: int) -> float:
  """The share of problems whose most common answer among their first k
  samples (a tie goes to the answer seen first; samples with no answer do
  not vote) is right."""
  right = 0
  for texts, answer in zip(samples, answers):
    votes = [(verifier.answer(t), t) for t in texts[:k]]
    counts = collections.Counter(v for v, _ in votes if v is not None)
    if counts:
      top = max(counts.values())
      winner = next(t for v, t in votes if v is not None and counts[v] == top)
      right += verifier.right(winner, answer)
  return right / max(len(answers), 1)


def check_sampled(k: int, n: int, prefix: str = '--config.eval_') -> None:
  """pass@k's k (0: off, else at least 2) and samples n (0: k, else at
  least k)."""
  if k < 0 or k == 1:
    raise UsageError(f'{prefix}k={k} must be 0 (greedy only) or at least 2 '
                     'samples per problem.')
  if n and n < k:
    raise UsageError(f'{prefix}n={n} must be at least {prefix}k={k} (or 0: '
                     'k).')


def sampled(engine: RolloutEngine, tokenizer: Tokenizer,
            prompts: Sequence[Sequence[int]], answers: Sequence[str], k: int,
            n: int, sampling: SamplingConfig, batch_size: int,
            verifier: Verifier = EXACT) -> dict[str, float]:
  """pass@k and maj@k from n >= k samples per problem."""
  repeated = [p for p in prompts for _ in range(n)]
  texts = completions(engine, tokenizer, repeated, sampling.max_new_tokens,
                      batch_size, sampling)
  samples = [texts[i * n:(i + 1) * n] for i in range(len(prompts))]
  right = np.array([[verifier.right(t, a) for t in row]
                    for row, a in zip(samples, answers)]).reshape(-1, n)
  return {f'pass@{k}': pass_at_k(right, k),
          f'maj@{k}': maj_at_k(samples, answers, verifier, k)}
