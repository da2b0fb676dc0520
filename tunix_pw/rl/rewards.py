"""Reward functions, registered by name and combined with weights.

A reward function sees one sample: `fn(sample) -> float` with
`sample = Sample(prompt, completion, answer, length, budget)`. A function
that raises or returns NaN is reported with the offending sample and scores
0 for it, unless the run is configured to stop on reward errors.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
import logging
import math
import re

import numpy as np

from tunix_pw import registry
from tunix_pw.errors import UsageError
from tunix_pw.rl import math_equal as math_lib
from tunix_pw.train.evaluate import Verifier
from tunix_pw.registry import register

_NUMBER = re.compile(r'-?\d[\d,]*(?:\.\d+)?')


@dataclasses.dataclass(frozen=True)
class Sample:
  prompt: str
  completion: str
  answer: str
  length: int  # generated tokens
  budget: int  # max new tokens
  truncated: bool  # hit the budget without a stop token
  model_score: float | None = None  # the reward model's (rl.reward_model)
  judge_score: float | None = None  # the LLM judge's (rl.judge)


def number(text: str) -> float | None:
  """The last number of `text` (thousands separators dropped), or None."""
  match = _NUMBER.findall(text)
  if not match:
    return None
  try:
    return float(match[-1].replace(',', ''))
  except ValueError:
    return None


def numbers_equal(text: str, answer: str) -> bool:
  """Whether `text`'s last number is the reference's."""
  got, want = number(text), number(answer)
  return got is not None and want is not None and got == want


def _number_words(text: str, answer: str) -> str:
  """The word on a wrong number: too high, too low or no number."""
  got, want = number(text), number(answer)
  if got is None or want is None:
    return 'no number'
  return 'too high' if got > want else 'too low'


@register('reward', 'exact_answer')
def exact_answer(sample: Sample) -> float:
  """1 when the completion's (last) number equals the reference number."""
  return float(numbers_equal(sample.completion, sample.answer))


@register('reward', 'exact')
def exact(sample: Sample) -> float:
  """1 when the whole completion is the reference answer (surrounding
  whitespace aside): one-word answers, such as the bars task's."""
  return float(sample.completion.strip() == sample.answer.strip())


@register('reward', 'reward_model')
def reward_model(sample: Sample) -> float:
  """The reward model's score of prompt + completion (a model loaded from
  --config.rl.reward_model scores every sample of a step at once)."""
  if sample.model_score is None:
    raise ValueError('no reward model scored this sample; set '
                     '--config.rl.reward_model')
  return sample.model_score


@register('reward', 'judge')
def judge(sample: Sample) -> float:
  """The LLM judge's score over its scale, in [0, 1] (a malformed answer:
  --config.rl.judge_malformed; rl/judge.py)."""
  if sample.judge_score is None:
    raise ValueError('no judge scored this sample; set --config.rl.judge')
  return sample.judge_score


@register('reward', 'math_equal')
def math_equal(sample: Sample) -> float:
  """1 when the completion's final answer (its last \\boxed{}, else after
  'answer is') equals the reference by value: fractions, decimals,
  thousands separators, simple LaTeX, units (rl/math_equal.py)."""
  return float(math_lib.equal(math_lib.final_answer(sample.completion),
                              sample.answer))


def _math_answer(text: str) -> str | None:
  return math_lib.normalise(math_lib.final_answer(text)) or None


def _math_right(text: str, answer: str) -> bool:
  try:  # a check past its limit is not right
    return bool(math_equal(Sample('', text, answer, 0, 0, False)))
  except (TimeoutError, MemoryError, RuntimeError):
    return False


# Verifiers by a reward's extraction and equivalence (the answer votes in
# maj@k; math_equal's are its normalised final answers).
EXACT_ANSWER = register('verifier', 'exact_answer')(Verifier(
    number, numbers_equal, _number_words))
register('verifier', 'math_equal')(Verifier(_math_answer, _math_right))


def verifier(name: str, rewards: str = '',
             field: str = '--config.eval_verifier') -> Verifier:
  """The registered verifier `name`; '' picks math_equal when `rewards` (a
  weights spec) uses it, else exact_answer."""
  if not name:
    name = ('math_equal' if 'math_equal' in dict(parse_weights(rewards))
            else 'exact_answer') if rewards else 'exact_answer'
  registry.check('verifier', name, field)
  return registry.get('verifier', name)


@register('reward', 'digits')
def digits(sample: Sample) -> float:
  """Partial credit for arithmetic: the fraction of the reference's digits
  the completion gets right, aligned from the last digit (a dense signal
  while exact answers are still rare)."""
  got = re.sub(r'\D', '', sample.completion)
  want = re.sub(r'\D', '', sample.answer)
  if not want:
    return 0.0
  hits = sum(a == b for a, b in zip(reversed(got), reversed(want)))
  return hits / max(len(want), len(got))


@register('reward', 'format')
def format_reward(sample: Sample) -> float:
  """1 when the completion is a bare number that ended with a stop token."""
  return float(bool(re.fullmatch(r'\s*-?\d[\d,]*(\.\d+)?\s*',
                                 sample.completion)) and
               not sample.truncated)


@register('reward', 'overlong')
def overlong(sample: Sample) -> float:
  """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13): 0 up to
  budget - cache, then linearly down to -1 at the budget; -1 when
  truncated. The cache is a quarter of the budget."""
  cache = max(sample.budget // 4, 1)
  if sample.truncated:
    return -1.0
  if sample.length <= sample.budget - cache:
    return 0.0
  return (sample.budget - cache - sample.length) / cache


def parse_weights(spec: str, field: str = '--config.rl.rewards'
                  ) -> list[tuple[str, float]]:
  """'exact_answer:1,format:0.1' -> [(name, weight), ...], names checked."""
  out = []
  for part in (p.strip() for p in spec.split(',') if p.strip()):
    name, _, weight = part.partition(':')
    registry.check('reward', name, field)
    try:
      out.append((name, float(weight or 1.0)))
    except ValueError:
      raise UsageError(f'{field}: weight {weight!r} of {name!r} is not a '
                       'number.') from None
  if not out:
    raise UsageError(f'{field} names no reward function.')
  return out


def score(samples: Sequence[Sample], weights: list[tuple[str, float]],
          strict: bool) -> tuple[np.ndarray, dict[str, np.ndarray], int]:
  """(total reward [N], per-function rewards, errors). A raising or
  non-finite (NaN, +-inf) reward is logged with its sample and scores 0, or
  raises when strict."""
  per_fn, errors = {}, 0
  for name, _ in weights:
    fn = registry.get('reward', name)
    values = np.zeros(len(samples), np.float32)
    for i, sample in enumerate(samples):
      try:
        value = float(fn(sample))
        if not math.isfinite(value):
          raise ValueError(f'returned {value}')
      except Exception as e:  # pylint: disable=broad-exception-caught
        if strict:
          raise RuntimeError(f'reward {name!r} failed on sample {sample}: '
                             f'{e}') from e
        errors += 1
        logging.warning('reward %r failed (%s: %s) on %s; scored 0', name,
                        type(e).__name__, e, sample)
        value = 0.0
      values[i] = value
    per_fn[name] = values
  total = sum(w * per_fn[name] for name, w in weights)
  return np.asarray(total, np.float32), per_fn, errors
