"""pass@k and maj@k equal hand computation on fixed samples, judged by the
rewards' extraction and equivalence (rl/rewards.py's verifiers)."""

import math

import numpy as np
import pytest

from tunix_pw.rl import rewards
from tunix_pw.train import evaluate

NUMBERS = rewards.verifier('exact_answer')


def test_pass_at_k_is_the_unbiased_estimate_from_n_samples():
  # n = 5 samples, k = 2: 1 - C(n - c, 2) / C(5, 2) for c right.
  right = np.array([[0, 1, 0, 0, 0],  # c = 1: 1 - 6/10
                    [0, 0, 0, 0, 0],  # c = 0: 0
                    [1, 1, 1, 1, 1],  # c = 5: 1
                    [1, 0, 0, 1, 0]], bool)  # c = 2: 1 - 3/10
  assert evaluate.pass_at_k(right, 2) == pytest.approx(
      (0.4 + 0 + 1 + 0.7) / 4)
  # n = k: any sample right.
  assert evaluate.pass_at_k(right[:, :3], 3) == pytest.approx(
      (1 + 0 + 1 + 1) / 4)
  assert evaluate.pass_at_k(right, 1) == pytest.approx(
      (1 / 5 + 0 + 1 + 2 / 5) / 4)
  assert math.comb(5, 2) == 10


def test_maj_at_k_votes_over_answers_not_texts():
  samples = [
      # 42 wins 2:1:1 though its two texts differ.
      ['so 40 + 2 = 42', '#### 42', 'it is 41', '40'],
      ['7', '8', '8', '7'],  # a 2:2 tie goes to the answer seen first: 7
      ['1', '2', '3', '3'],  # 3 wins, but the answer is 1
      ['10', 'ten', 'x = 10', '9'],  # 10 (no number in 'ten': no vote)
      ['9', '9', '3', '3', '3'],  # k = 4: the fifth sample does not vote
  ]
  answers = ['42', '8', '1', '10', '9']
  # Right: problems 0, 3 and 4.
  assert evaluate.maj_at_k(samples, answers, NUMBERS, 4) == 3 / 5
  # Votes over whole texts split problem 0's 42s: only 3 and 4 are right.
  assert evaluate.maj_at_k(samples, answers, evaluate.EXACT, 4) == 2 / 5


@pytest.mark.parametrize('completion, answer, right', [
    ('We add 40 and 2, so the result is\n#### 42', '42', True),
    ('The answer is 1,000.', '1000', True),
    ('41', '42', False),
    ('no idea', '42', False),
])
def test_a_completion_that_reasons_first_counts(completion, answer, right):
  assert NUMBERS.right(completion, answer) is right


def test_math_answers_are_judged_by_value():
  math = rewards.verifier('', 'math_equal:1.0,format:0.1')
  assert math.right('First x, then \\boxed{\\frac{1}{2}}', '0.5')
  assert math.answer('so \\boxed{0.50}') == '0.50'
  assert rewards.verifier('', 'exact_answer:1') is NUMBERS
  with pytest.raises(rewards.UsageError, match='not a registered verifier'):
    rewards.verifier('nope')
