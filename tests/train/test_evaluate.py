"""pass@k and maj@k equal hand computation on fixed samples."""

import numpy as np

from tunix_pw.train import evaluate


def test_pass_at_k():
  # Problem 0: a right sample among 3; 1: none; 2: all right; 3: the last.
  correct = np.array([[0, 1, 0], [0, 0, 0], [1, 1, 1], [0, 0, 1]], bool)
  assert evaluate.pass_at_k(correct) == 3 / 4


def test_maj_at_k():
  samples = [
      ['42', ' 42', '41', '40'],  # 42 wins 2:1:1 (whitespace stripped)
      ['7', '8', '8', '7'],  # a 2:2 tie goes to the answer seen first: 7
      ['1', '2', '3', '3'],  # 3 wins, but the answer is 1
      ['10', '10', '10', '9'],  # 10 wins and is right
  ]
  answers = ['42', '8', '1', '10']
  # Right: problems 0 and 3 (problem 1's majority is 7, not 8).
  assert evaluate.maj_at_k(samples, answers) == 2 / 4
