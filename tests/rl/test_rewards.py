"""Rewards for the built-in datasets, and failures that do not kill a run."""

import logging

import pytest

from tunix_pw.errors import UsageError
from tunix_pw.rl import rewards
from tunix_pw.registry import register


def sample(completion, answer='42', length=3, budget=8, truncated=False):
  return rewards.Sample('12+30=', completion, answer, length, budget,
                        truncated)


@pytest.mark.parametrize('completion, expected', [
    ('42', 1.0), (' 42 ', 1.0), ('The answer is 42', 1.0), ('41', 0.0),
    ('', 0.0), ('4,200', 0.0)])
def test_exact_answer(completion, expected):
  assert rewards.exact_answer(sample(completion)) == expected
  assert rewards.exact_answer(sample('1,234', answer='1234')) == 1.0


def test_format_digits_and_overlong():
  assert rewards.format_reward(sample('42')) == 1.0
  assert rewards.format_reward(sample('42 apples')) == 0.0
  assert rewards.format_reward(sample('42', truncated=True)) == 0.0
  assert rewards.digits(sample('43')) == 0.5
  assert rewards.digits(sample('142')) == pytest.approx(2 / 3)
  # DAPO eq. 13 with a budget of 8 and a cache of 2.
  assert rewards.overlong(sample('x', length=6)) == 0.0
  assert rewards.overlong(sample('x', length=7)) == -0.5
  assert rewards.overlong(sample('x', length=8, truncated=True)) == -1.0


@register('reward', 'test_flaky')
def flaky(s):
  if s.completion == 'boom':
    raise ValueError('no parse')
  if s.completion in ('nan', 'inf', '-inf'):
    return float(s.completion)
  return 1.0


def test_failing_rewards_are_reported_and_score_zero(caplog):
  weights = rewards.parse_weights('test_flaky:2,exact_answer:1')
  samples = [sample('42'), sample('boom'), sample('nan'), sample('inf'),
             sample('-inf')]
  with caplog.at_level(logging.WARNING):
    total, per_fn, errors = rewards.score(samples, weights, strict=False)
  # +-inf would make the group's advantages NaN: scored like NaN.
  assert total.tolist() == [3.0, 0.0, 0.0, 0.0, 0.0] and errors == 4
  assert per_fn['test_flaky'].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
  assert "completion='boom'" in caplog.text
  for value in ('nan', 'inf', '-inf'):
    assert f'returned {value}' in caplog.text
  with pytest.raises(RuntimeError, match="reward 'test_flaky' failed"):
    rewards.score(samples, weights, strict=True)


def test_reward_spec_errors():
  with pytest.raises(UsageError, match="'nope' is not a registered reward"):
    rewards.parse_weights('exact_answer:1,nope:1')
  with pytest.raises(UsageError, match='is not a number'):
    rewards.parse_weights('exact_answer:x')
