"""The math_equal reward: final answers equal by value, not by spelling
(and not equal when they differ), each check within a time limit."""

import threading
import time

import psutil
import pytest

from tunix_pw.rl import math_equal, rewards

EQUAL = [
    ('3', '3'), ('3.0', '3'), ('0.5', '\\frac{1}{2}'), ('1/2', '0.5'),
    ('\\frac12', '0.5'), ('\\dfrac{3}{4}', '0.75'), ('1,000', '1000'),
    ('1,234,567', '1234567'), ('x=3', '3'), ('x = -2', '-2'),
    ('$5', '5'), ('\\$5.00', '5'), ('50\\%', '50'), ('50%', '50'),
    ('12 dollars', '12'), ('7 cm', '7'), ('90^\\circ', '90'),
    ('90°', '90'), ('12 \\text{apples}', '12'), ('\\boxed{42}', '42'),
    ('\\sqrt{4}', '2'), ('\\sqrt{8}', '2\\sqrt{2}'), ('2^3', '8'),
    ('2^{10}', '1024'), ('\\frac{\\sqrt{3}}{2}', '\\sqrt{3}/2'),
    ('3\\cdot 4', '12'), ('6 \\times 7', '42'), ('\\pi', 'pi'),
    ('2\\pi', '\\pi*2'), ('-\\frac{2}{4}', '-0.5'), ('1e3', '1000'),
    ('0.3333333333', '0.33333333331'), ('\\left(\\frac{1}{3}\\right)', '1/3'),
    ('x+x', '2x'), ('(x+1)^2', 'x^2+2x+1'), ('10.', '10'),
    ('\\sqrt[3]{27}', '3'), ('\\frac{\\frac{1}{2}}{2}', '0.25'),
]
NOT_EQUAL = [
    ('3', '4'), ('0.5', '\\frac{1}{3}'), ('1,000', '100'), ('x=3', '4'),
    ('-2', '2'), ('\\sqrt{2}', '1.414'), ('2^3', '9'), ('x+1', 'x'),
    ('12', '1,2'), ('', '3'), ('banana', '3'), ('\\frac{1}{0}', '1'),
    ('101', '100'), ('3.01', '3'),
]


@pytest.mark.parametrize('answer, reference', EQUAL)
def test_equal(answer, reference):
  assert math_equal.equal(answer, reference)
  assert math_equal.equal(reference, answer)


@pytest.mark.parametrize('answer, reference', NOT_EQUAL)
def test_not_equal(answer, reference):
  assert not math_equal.equal(answer, reference)


def test_at_least_forty_cases():
  assert len(EQUAL) + len(NOT_EQUAL) >= 40


def test_final_answer_is_the_last_box_or_what_follows_answer_is():
  assert math_equal.final_answer(
      'First \\boxed{1}, then \\boxed{\\frac{3}{4}} done') == '\\frac{3}{4}'
  assert math_equal.final_answer('So the answer is 17.') == '17'
  assert math_equal.final_answer('42') == '42'


def test_the_reward_on_samples():
  def sample(completion, answer):
    return rewards.Sample('q', completion, answer, 5, 10, False)
  assert rewards.math_equal(sample('We get \\boxed{0.5}', '\\frac{1}{2}')) == 1
  assert rewards.math_equal(sample('The answer is 1,000', '1000')) == 1
  assert rewards.math_equal(sample('\\boxed{3}', '4')) == 0


def test_the_limits_hold_off_the_main_thread_and_memory_stays_out():
  """On the scoring thread of asynchronous RL (no signals there), a slow
  check still times out; a memory blow-up ends in the helper process."""
  outcome = []
  thread = threading.Thread(target=lambda: outcome.append(pytest.raises(
      TimeoutError, math_equal.equal, '(x+1)^(10^6)', 'x', time_limit_s=0.2)))
  start = time.monotonic()
  thread.start()
  thread.join(timeout=10)
  assert outcome and time.monotonic() - start < 5
  before = psutil.Process().memory_info().rss
  with pytest.raises(MemoryError):  # given the time, it outgrows its cap
    math_equal.equal('(x+1)^(10^6)', 'x', time_limit_s=60)
  assert psutil.Process().memory_info().rss - before < 100 * 2**20
  assert math_equal.equal('\\frac{1}{2}', '0.5')  # a fresh helper


def test_a_slow_check_times_out_and_is_counted_by_the_reward(monkeypatch):
  start = time.monotonic()
  with pytest.raises(TimeoutError):
    math_equal.equal('(x+1)^(10^6)', 'x', time_limit_s=0.2)
  assert time.monotonic() - start < 5
  monkeypatch.setattr(math_equal, 'TIME_LIMIT_S', 0.2)
  scores, _, errors = rewards.score(
      [rewards.Sample('q', '\\boxed{(x+1)^(10^6)}', 'x', 5, 10, False),
       rewards.Sample('q', '\\boxed{2}', '2', 5, 10, False)],
      [('math_equal', 1.0)], strict=False)
  assert errors == 1 and list(scores) == [0.0, 1.0]
