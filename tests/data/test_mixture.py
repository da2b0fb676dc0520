"""Datasets mixed by weight: shares follow the weights, each example names
its dataset, and the stream resumes exactly from its state."""

import itertools

from tunix_pw.data import mixture, pipeline


class _Source:
  """A random-access source of `n` records (what TFDS sources are)."""

  def __init__(self, name, n):
    self.name, self.n = name, n

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    return dict(text=f'{self.name}{i}'.encode())


def streams(seed=0):
  return {name: pipeline.Pipeline(
      _Source(name, n), lambda ex, counters: ex, batch_size=1, seed=seed,
      num_epochs=None) for name, n in (('a', 50), ('b', 30), ('c', 7))}


def test_shares_follow_the_weights_over_1000_draws():
  mixed = mixture.Mixture(streams(), {'a': 6.0, 'b': 3.0, 'c': 1.0},
                          batch_size=10, seed=0)
  names = [ex['dataset'] for batch in itertools.islice(mixed, 100)
           for ex in batch]
  assert len(names) == 1000
  shares = {n: names.count(n) / 1000 for n in 'abc'}
  # Binomial standard deviations at n=1000: 1.5, 1.4 and 0.9 points.
  assert abs(shares['a'] - 0.6) < 0.05
  assert abs(shares['b'] - 0.3) < 0.05
  assert abs(shares['c'] - 0.1) < 0.03
  assert all(ex['text'].startswith(ex['dataset']) for batch in
             itertools.islice(mixed, 5) for ex in batch)


def test_resumes_from_its_state():
  weights = {'a': 1.0, 'b': 1.0, 'c': 1.0}
  first = mixture.Mixture(streams(), weights, batch_size=4, seed=3)
  for _ in range(7):
    next(first)
  saved = first.state()
  expected = [next(first) for _ in range(5)]
  second = mixture.Mixture(streams(), weights, batch_size=4, seed=3)
  second.restore(saved)
  assert [next(second) for _ in range(5)] == expected
