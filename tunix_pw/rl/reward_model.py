"""A reward model scoring an RL step's samples (the `reward_model` reward):
`--config.rl.reward_model` names the reward_model job's export, loaded once
onto the rollout mesh (where the samples were generated) and never trained.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flax import nnx
import jax
import numpy as np

from tunix_pw.data import pipeline
from tunix_pw.models import value
from tunix_pw.rl import phases
from tunix_pw.runtime.fetch import fetch
from tunix_pw.runtime.sharding import Sharder


def program(graphdef: Any, mesh: Any, rules: Any) -> Callable:
  """jitted (reward model state, sequences) -> each row's score."""
  shard = Sharder(mesh, rules)
  return jax.jit(lambda state, b: value.last_token(
      nnx.merge(graphdef, state)(b['tokens'], b['positions'],
                                 b['segment_ids'], shard), b['segment_ids']))


def scorer(config: Any, meshes: Any
           ) -> Callable[[list[list[int]]], np.ndarray]:
  """sequences (prompt + completion token ids) -> the reward model's
  scores, `rl.logps_micro_batch_size` rows at a time."""
  rl, mesh, rules = config.rl, meshes['rollout'], config.sharding
  graphdef, state = nnx.split(value.load(rl.reward_model, mesh, rules))
  score = program(graphdef, mesh, rules)
  length = rl.max_prompt_length + rl.max_new_tokens

  def scores(sequences: list[list[int]]) -> np.ndarray:
    rows = pipeline.pad_batch([dict(tokens=s, loss_mask=[1] * len(s))
                               for s in sequences], length, 0)
    return fetch(phases.chunked_logps(score, state, rows, mesh, rules,
                                      rl.logps_micro_batch_size))

  return scores
