"""Several datasets mixed by weight into one stream of RL prompts.

Each example of a batch is drawn from dataset `name` with probability
weight / sum(weights), by a generator seeded with (seed, draw number): the
stream is resumable from the draw count and each dataset's own pipeline
state, whatever happened before. Every example carries its dataset's name,
which picks its reward functions and its metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tunix_pw.data.pipeline import Pipeline


class Mixture:
  """Batches of `batch_size` examples from `pipelines` (name -> a
  Pipeline of batch size 1), mixed by `weights` (name -> weight)."""

  def __init__(self, pipelines: Mapping[str, Pipeline],
               weights: Mapping[str, float], batch_size: int, seed: int):
    self.names = list(pipelines)
    self.pipelines = dict(pipelines)
    total = sum(weights[n] for n in self.names)
    self.cumulative = np.cumsum([weights[n] / total for n in self.names])
    self.batch_size, self.seed, self.draws = batch_size, seed, 0

  def __iter__(self):
    return self

  def draw(self) -> str:
    """The dataset of the next example."""
    u = np.random.default_rng([self.seed, self.draws]).random()
    self.draws += 1
    index = int(np.searchsorted(self.cumulative, u, side='right'))
    return self.names[min(index, len(self.names) - 1)]

  def __next__(self) -> list[dict[str, Any]]:
    batch = []
    for _ in range(self.batch_size):
      name = self.draw()
      [example] = next(self.pipelines[name])
      batch.append(dict(example, dataset=name))
    return batch

  def state(self) -> dict[str, Any]:
    return dict(draws=self.draws,
                **{n: p.state() for n, p in self.pipelines.items()})

  def restore(self, state: dict[str, Any]) -> None:
    self.draws = int(state['draws'])
    for n, p in self.pipelines.items():
      p.restore(state[n])
