"""A reward model scoring an RL step's samples (the `reward_model` reward):
`--config.rl.reward_model` names the reward_model job's export, loaded once
onto the rollout mesh (where the samples were generated) and never trained
there; and what the reward_model job trains it with (the Bradley-Terry
loss on pairs, the held-out pairwise accuracy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from tunix_pw.data import pipeline
from tunix_pw.models import value
from tunix_pw.rl import phases
from tunix_pw.runtime.fetch import fetch
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.train import losses

SIDES = ('chosen', 'rejected')


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


def scores(model, batch, side: str, shard: Sharder = Sharder()) -> jax.Array:
  """[B]: the score of each `side` sequence of a batch of pairs."""
  values = model(batch[f'{side}_tokens'], batch[f'{side}_positions'],
                 batch[f'{side}_segment_ids'], shard)
  return value.last_token(values, batch[f'{side}_segment_ids'])


def bradley_terry_loss(model, batch, rng, *,
                       shard: Sharder = Sharder()):
  """The train step's loss on a batch of pairs: -log sigmoid(s_chosen -
  s_rejected), with the pairs ranked right and the margins as sums."""
  del rng
  chosen, rejected = (scores(model, batch, side, shard) for side in SIDES)
  return losses.bradley_terry(chosen, rejected).sum(), dict(
      weight=jnp.float32(chosen.shape[0]),
      accuracy=(chosen > rejected).sum().astype(jnp.float32),
      margin=(chosen - rejected).sum())


def margins_program(config: Any, model_program: program.Program):
  """jitted (params, pairs) -> score(chosen) - score(rejected) per pair."""
  shard = Sharder(model_program.mesh, config.sharding)

  def margins(params, batch):
    model = nnx.merge(model_program.graphdef, params)
    return (scores(model, batch, 'chosen', shard) -
            scores(model, batch, 'rejected', shard))

  return jax.jit(margins)


def pairwise_accuracy(config: Any, margins: Any, mesh: Any, params: Any,
                      heldout: Any) -> dict[str, float]:
  """The share of held-out pairs whose chosen sequence scores higher."""
  right = total = 0
  for batch in heldout():
    margin = fetch(margins(params, pipeline.place(batch, mesh,
                                                  config.sharding)))
    right, total = right + int((margin > 0).sum()), total + margin.size
  return {'eval/pairwise_accuracy': right / max(total, 1),
          'eval/pairs': total}
