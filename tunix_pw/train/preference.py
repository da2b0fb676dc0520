"""Preference algorithms as strategies (`--config.dpo.algorithm`).

Each registered `Preference` says what its batches hold (the two sequences
of a row, from pairs or from labelled examples), whether it needs the
frozen reference's log-probabilities, and how its loss and progress read
the per-sequence log-probabilities; the job (`jobs/dpo.py`) asks it and
never names an algorithm. Adding one touches this file (and its math in
`losses.py`).
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from tunix_pw import registry
from tunix_pw.data import formats
from tunix_pw.train import losses

PAIRED = ('chosen', 'rejected')
UNPAIRED = ('completion', 'mismatched')  # see formats.kto_batch

# Per sequence name: its summed completion log-probabilities and lengths.
SequenceLogps = dict[str, tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True)
class Settings:
  """The `dpo` block's loss settings."""

  beta: float
  orpo_lambda: float
  kto_lambdas: tuple[float, float]

  @classmethod
  def from_block(cls, block: Any) -> 'Settings':
    return cls(block.beta, block.orpo_lambda,
               (block.kto_lambda_desirable, block.kto_lambda_undesirable))


@dataclasses.dataclass(frozen=True)
class Preference:
  """sides: the two sequences of a batch row (`{side}_tokens`, ...).
  loss: (their log-probabilities, the batch, settings) -> (summed loss,
    metrics summed over rows, with their `weight`).
  reference: the batch carries the reference's `ref_{side}` sums.
  labels: per-row arrays a batch holds besides the sequences.
  examples_per_pair: rows a pair of the data becomes.
  transform, batch: the data pipeline's example transform and batcher.
  progress: the metric shown beside the loss; unit: what a row is."""

  sides: tuple[str, str]
  loss: Callable[[SequenceLogps, dict[str, Any], Settings],
                 tuple[jax.Array, dict[str, jax.Array]]]
  reference: bool = True
  labels: tuple[str, ...] = ()
  examples_per_pair: int = 1
  transform: Callable[..., Any] = formats.preference_transform
  batch: Callable[..., Any] = formats.pad_pairs
  progress: str = 'margin'
  unit: str = 'pairs'


def get(name: str) -> Preference:
  return registry.get('preference_loss', name)


def pair_margin(pair: losses.Pair) -> jax.Array:
  """Per pair: the implicit reward margin (pi_c - pi_r) - (ref_c - ref_r),
  or, without a reference, the mean log-probability per completion
  token's."""
  if pair.ref_chosen is None:
    return (pair.chosen / pair.chosen_tokens -
            pair.rejected / pair.rejected_tokens)
  return losses.margin(pair)


def paired(per_pair: Callable[[losses.Pair, float, float], jax.Array]):
  """A loss over pairs from a per-pair function (pair, beta, lambda) ->
  [pairs] (those of `losses`, or one of your own)."""

  def loss(logps: SequenceLogps, batch: dict[str, Any], settings: Settings):
    pair = losses.Pair(*logps['chosen'], *logps['rejected'],
                       batch.get('ref_chosen'), batch.get('ref_rejected'))
    per = per_pair(pair, settings.beta, settings.orpo_lambda)
    margin = pair_margin(pair)
    if pair.ref_chosen is not None:
      margin = settings.beta * margin
    return per.sum(), dict(weight=jnp.float32(per.shape[0]),
                           margin=margin.sum(),
                           preferred=(margin > 0).sum().astype(jnp.float32))

  return loss


def _kto(logps: SequenceLogps, batch: dict[str, Any], settings: Settings):
  """KTO's loss over labelled examples; `preferred`: examples whose reward
  sits on their label's side of the reference point."""
  (completion, _), (mismatched, _) = (logps[side] for side in UNPAIRED)
  examples = losses.Unpaired(completion, batch['ref_completion'], mismatched,
                             batch['ref_mismatched'], batch['desirable'])
  per_example = losses.kto(examples, settings.beta, *settings.kto_lambdas)
  z0 = losses.kto_reference_point(examples)
  side = (completion - examples.ref_logps - z0) * (2 * examples.desirable - 1)
  count = jnp.float32(per_example.shape[0])
  return per_example.sum(), dict(weight=count, kl=z0 * count,
                                 preferred=(side > 0).sum().astype(
                                     jnp.float32))


registry.register('preference_loss', 'dpo')(
    Preference(PAIRED, paired(losses.dpo)))
registry.register('preference_loss', 'ipo')(
    Preference(PAIRED, paired(losses.ipo)))
registry.register('preference_loss', 'orpo')(
    Preference(PAIRED, paired(losses.orpo), reference=False))
registry.register('preference_loss', 'kto')(Preference(
    UNPAIRED, _kto, labels=('desirable',), examples_per_pair=2,
    transform=formats.unpaired_transform, batch=formats.kto_batch,
    progress='kl', unit='examples'))
