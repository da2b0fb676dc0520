"""Preference algorithms as strategies (`--config.dpo.algorithm`).

Each registered `Preference` says what its batches hold (the two sequences
of a row, from pairs or from labelled examples), whether it needs the
frozen reference's log-probabilities, and how its loss and progress read
the per-sequence log-probabilities; the job (`jobs/dpo.py`) asks it and
never names an algorithm. Adding one touches this file (and its math in
`losses.py`). Also here: the train step's loss over a model, the pair
pipelines and the held-out pairwise accuracy the job runs.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from tunix_pw import registry
from tunix_pw.data import builders, formats, pipeline
from tunix_pw.runtime.fetch import fetch
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.train import losses
from tunix_pw.train import step as step_lib

PAIRED = ('chosen', 'rejected')
UNPAIRED = ('completion', 'mismatched')  # see formats.kto_batch
PAIRED_DATA = ('preferences', 'arithmetic')  # data with (held-out) pairs

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


def sequence_logps(model, batch, side: str, shard: Sharder = Sharder(),
                   chunk: int = 0):
  """Summed completion log-probability and completion length per row (the
  logits `--config.logits_chunk` positions at a time)."""
  nll, weight, _ = step_lib.model_token_nll(
      model, batch[f'{side}_tokens'], batch[f'{side}_positions'],
      batch[f'{side}_segment_ids'], batch[f'{side}_loss_mask'], shard, chunk)
  return -(nll * weight).sum(-1), weight.sum(-1)


def model_loss(model, batch, rng, *, algorithm: Preference,
               settings: Settings, shard: Sharder = Sharder(),
               chunk: int = 0):
  """The train step's loss: `algorithm`'s, of the model's summed
  log-probabilities of each of its sequences."""
  del rng
  return algorithm.loss(
      {side: sequence_logps(model, batch, side, shard, chunk)
       for side in algorithm.sides}, batch, settings)


def pair_pipeline(config: Any, source: Any, name: str, tokenizer: Any,
                  runtime: Any, transform: Any, batch_fn: Any, *,
                  batch_size: int, epochs: int | None,
                  what: str) -> pipeline.Pipeline:
  length = config.data.max_length
  return pipeline.Pipeline(
      source, transform(name, tokenizer, length, config.data.overlong,
                        config.data.chat),
      batch_size=batch_size, seed=config.seed, num_epochs=epochs,
      process_index=runtime.process_index,
      process_count=runtime.process_count,
      batch_fn=lambda rows: batch_fn(rows, length, tokenizer.pad_id),
      what=what, dropping=pipeline.overlong_filter(config.data))


def pairs_of_labelled(source: Any) -> list[dict[str, str]]:
  """Held-out pairs from labelled examples: each prompt's first desirable
  completion over its first undesirable one (prompts with both)."""
  first = {}
  for i in range(len(source)):
    example = builders.decode(source[i])
    first.setdefault(example['prompt'], {}).setdefault(
        bool(example['label']), example['completion'])
  return [dict(prompt=prompt, chosen=sides[True], rejected=sides[False])
          for prompt, sides in first.items() if len(sides) == 2]


def heldout_pairs(config: Any, name: str, source: Any, tokenizer: Any,
                  runtime: Any) -> Callable[[], pipeline.Pipeline]:
  """One pass over the held-out pairs, anew each call: a pair set's test
  split, or the pairs in a labelled one; checked to fill a batch."""
  paired = name in PAIRED_DATA
  pairs = source if paired else pairs_of_labelled(source)
  what = f'the test split of {name}' + ('' if paired else ' (its pairs)')
  pipeline.check_eval_batch(pairs, config.eval_batch_size, what)
  return lambda: pair_pipeline(
      config, pairs, name if paired else 'preferences', tokenizer, runtime,
      formats.preference_transform, formats.pad_pairs,
      batch_size=config.eval_batch_size, epochs=1, what=what)


def pairwise_accuracy(policy_logps: Any, reference_logps: Any,
                      heldout: Any) -> dict[str, float]:
  """The share of held-out pairs the policy prefers the right way, by
  `pair_margin` (without a reference (None), per token)."""
  right = total = 0
  for batch in heldout():
    sums = [(logps, batch[f'{side}_loss_mask'].sum(-1))
            for side, logps in zip(PAIRED, fetch(policy_logps(batch)))]
    references = (() if reference_logps is None else
                  fetch(reference_logps(batch)))
    margin = pair_margin(losses.Pair(*sums[0], *sums[1], *references))
    right, total = right + int((margin > 0).sum()), total + margin.size
  return {'eval/pairwise_accuracy': right / max(total, 1),
          'eval/pairs': total}
