"""Grain pipelines over the TFDS array_record sources.

A `Pipeline` reads its process's disjoint share of a split (every
`process_count`-th example; the whole split on a single controller),
shuffles it with a seed (reshuffled each epoch), turns examples into model
inputs with a per-example transform (which may drop an example: counted),
optionally packs them into fixed-length rows, and batches. Its state (the
grain iterator's and the counters) is a small JSON-able dict saved with the
model checkpoint, so a resumed run continues with exactly the next batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import logging
import os
from typing import Any

import grain
import jax
from jax.experimental import multihost_utils
import numpy as np
import tensorflow_datasets as tfds

from tunix_pw import checks
from tunix_pw.data import builders
from tunix_pw.errors import UsageError
from tunix_pw.runtime import backend, sharding

OVERLONG = ('truncate', 'drop')


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """Which dataset, built where, from what."""

  name: str
  data_dir: str
  manual_dir: str = ''
  on_bad_line: str = 'error'
  arithmetic: tuple[tuple[str, Any], ...] = ()

  @classmethod
  def from_block(cls, block: Any) -> 'DataSpec':
    return cls(block.name, os.path.expanduser(block.data_dir),
               block.manual_dir, block.on_bad_line,
               tuple(block.arithmetic.items()))

  def check(self) -> None:
    """The checks that read no files: a known builder and its settings."""
    if self.name not in builders.BUILDERS:
      raise UsageError(f'--config.data.name={self.name!r} is unknown; use '
                       f'one of {", ".join(builders.BUILDERS)}.')
    if self.name == 'arithmetic':
      builders.arithmetic_config(**dict(self.arithmetic))
    elif not self.manual_dir and checks.scope().data:
      raise UsageError(f'--config.data.manual_dir is required for '
                       f'{self.name}: a directory with train.jsonl and '
                       'test.jsonl.')

  def builder(self) -> tfds.core.DatasetBuilder:
    self.check()
    if self.name == 'arithmetic':
      config = builders.arithmetic_config(**dict(self.arithmetic))
    else:
      config = builders.jsonl_config(self.manual_dir, self.on_bad_line)
    return builders.BUILDERS[self.name](data_dir=self.data_dir, config=config,
                                        file_format='array_record')


def check_data_block(block: Any, prefix: str = '--config.data') -> None:
  """Static checks of a data block, shared by every job that reads data."""
  spec = DataSpec.from_block(block)
  if checks.scope().files:
    spec.builder()  # unknown names, bad arithmetic sizes, missing files
  else:
    spec.check()
  if block.overlong not in OVERLONG:
    raise UsageError(f'{prefix}.overlong={block.overlong!r} is unknown; use '
                     f'one of {", ".join(OVERLONG)}.')
  if block.max_length < 2:
    raise UsageError(f'{prefix}.max_length={block.max_length} must be at '
                     'least 2.')


def prepare(spec: DataSpec, runtime: backend.Runtime | None = None):
  """Builds the dataset once (on the coordinator), then opens its splits as
  random-access sources on every process. Returns (sources, skipped lines
  per split)."""
  builder = spec.builder()
  if runtime is None or runtime.is_coordinator:
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        manual_dir=spec.manual_dir or None))
  if runtime is not None and runtime.process_count > 1:
    multihost_utils.sync_global_devices(f'data {spec.name} prepared')
    builder = spec.builder()  # re-read the info the coordinator wrote
  skipped = dict(builder.info.metadata or {}).get('skipped_lines', {})
  if any(skipped.values()):
    logging.warning('data: skipped bad lines per split: %s', skipped)
  return builder.as_data_source(), skipped


def bucket(n: int, smallest: int = 16) -> int:
  size = smallest
  while size < n:
    size *= 2
  return size


@dataclasses.dataclass
class Counters:
  examples: int = 0
  dropped: int = 0
  truncated: int = 0


def fit(tokens: list[int], loss_mask: list[int], max_length: int,
        overlong: str, counters: Counters) -> dict[str, np.ndarray] | None:
  """An example as arrays, truncated or dropped when over `max_length`."""
  counters.examples += 1
  if len(tokens) > max_length:
    if overlong == 'drop':
      counters.dropped += 1
      return None
    counters.truncated += 1
    tokens, loss_mask = tokens[:max_length], loss_mask[:max_length]
  return dict(tokens=np.asarray(tokens, np.int32),
              loss_mask=np.asarray(loss_mask, np.int32))


def overlong_filter(block: Any, prefix: str = '--config.data') -> str:
  """The filter a data block's `overlong='drop'` applies, in words."""
  return (f'examples longer than {prefix}.max_length={block.max_length} '
          f'tokens are dropped ({prefix}.overlong={block.overlong!r})')


def pad_batch(examples: Sequence[dict[str, np.ndarray]], length: int,
              pad_id: int) -> dict[str, np.ndarray]:
  """[B, length] tokens, loss_mask, segment_ids (0 = padding), positions."""
  batch = len(examples)
  tokens = np.full((batch, length), pad_id, np.int32)
  loss_mask = np.zeros((batch, length), np.int32)
  segments = np.zeros((batch, length), np.int32)
  for i, ex in enumerate(examples):
    n = len(ex['tokens'])
    tokens[i, :n], loss_mask[i, :n], segments[i, :n] = (
        ex['tokens'], ex['loss_mask'], 1)
  positions = np.broadcast_to(np.arange(length, dtype=np.int32),
                              (batch, length)) * segments
  return dict(tokens=tokens, loss_mask=loss_mask, segment_ids=segments,
              positions=positions)


class Pipeline:
  """Batches of one split for this process, seeded and resumable.

  transform(example, counters) -> model input (or None to drop it);
  batch_fn(list) -> batch. Examples are transformed in this thread, as they
  are consumed, so the counters and the resumable state agree exactly.
  `pack_length` > 0 packs token examples into rows of that length (grain's
  first-fit packing: segment ids and positions per row). An empty share of
  the split, or (endless streams) a whole pass over it with every example
  dropped, is a UsageError naming `what` (the split) and `dropping` (the
  filter): the stream would otherwise spin forever."""

  def __init__(self, source: Any,
               transform: Callable[[dict, Counters], Any], *,
               batch_size: int, seed: int, num_epochs: int | None,
               process_index: int = 0, process_count: int = 1,
               batch_fn: Callable[[list], Any] | None = None,
               pack_length: int = 0, what: str = 'the split',
               dropping: str = 'the filter'):
    if batch_size % process_count:
      raise UsageError(f'batch size {batch_size} does not divide over '
                       f'{process_count} processes.')
    self.counters = Counters()
    self.local_batch = batch_size // process_count
    ds = grain.MapDataset.range(len(source))[process_index::process_count]
    if not len(ds):
      raise UsageError(f'{what} has no examples for process '
                       f'{process_index} of {process_count} ({len(source)} '
                       'in all).')
    share, passed = len(ds), [0, 0]  # examples seen, kept in this run

    def checked(i):
      # Each example carries its index in the split ('index').
      out = transform(dict(builders.decode(source[i]), index=i),
                      self.counters)
      passed[0] += 1
      passed[1] += out is not None
      if passed[0] >= share and not passed[1] and num_epochs is None:
        raise UsageError(f'all {share} examples of {what} were dropped: '
                         f'{dropping}.')
      return out

    ds = ds.shuffle(seed=seed).repeat(num_epochs, reseed_each_epoch=True)
    ds = ds.map(checked)
    iter_ds = ds.to_iter_dataset(grain.ReadOptions(
        num_threads=0, prefetch_buffer_size=0)).filter(
            lambda x: x is not None)
    if pack_length:
      iter_ds = grain.experimental.FirstFitPackIterDataset(
          iter_ds, length_struct=dict(tokens=pack_length,
                                      loss_mask=pack_length),
          num_packing_bins=self.local_batch, seed=seed)
      batch_fn = _packed_batch
    self._dataset = iter_ds.batch(self.local_batch, drop_remainder=True,
                                  batch_fn=batch_fn or list)
    self._iterator = iter(self._dataset)

  def __iter__(self):
    return self

  def __next__(self):
    return next(self._iterator)

  def state(self) -> dict[str, Any]:
    return dict(grain=self._iterator.get_state(),
                counters=dataclasses.asdict(self.counters))

  def restore(self, state: dict[str, Any]) -> None:
    self._iterator.set_state(state['grain'])
    self.counters = Counters(**state['counters'])


def _packed_batch(rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  stack = lambda key: np.stack([r[key] for r in rows]).astype(np.int32)
  return dict(tokens=stack('tokens'), loss_mask=stack('loss_mask'),
              segment_ids=stack('tokens_segment_ids'),
              positions=stack('tokens_positions'))


def place(batch: dict[str, np.ndarray], mesh: Any,
          rules: Any) -> dict[str, jax.Array]:
  """This process's rows of a batch onto the mesh as global arrays, sharded
  over the data axes."""
  out = {}
  for key, local in batch.items():
    global_shape = (local.shape[0] * jax.process_count(),) + local.shape[1:]
    target = sharding.batch(mesh, global_shape, rules)
    out[key] = jax.make_array_from_process_local_data(target, local,
                                                      global_shape)
  return out
