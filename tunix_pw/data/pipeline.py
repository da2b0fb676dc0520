"""Grain pipelines over the TFDS array_record sources.

A `Pipeline` shuffles a split into one global stream with a seed
(reshuffled each epoch), deals it into data shards, one per row of the
global batch, and reads the shards of its process's rows. It turns examples
into model inputs with a per-example transform (which may drop an example:
counted), optionally packs them into fixed-length rows, and batches. Its
state (each shard's grain position and counters) is a small JSON-able dict
saved with the model checkpoint, so a resumed run continues with exactly
the next batch, on this number of processes or another.
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
PACKING_BINS = 4  # first-fit bins of each data shard


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """Which dataset, built where, from what."""

  name: str
  data_dir: str
  manual_dir: str = ''
  on_bad_line: str = 'error'
  arithmetic: tuple[tuple[str, Any], ...] = ()
  train_examples: int = 0  # the first N of the train split only (0: all)

  @classmethod
  def from_block(cls, block: Any) -> 'DataSpec':
    return cls(block.name, os.path.expanduser(block.data_dir),
               block.manual_dir, block.on_bad_line,
               tuple(block.arithmetic.items()),
               block.get('train_examples', 0))

  def check(self) -> None:
    """The checks that read no files: a known builder and its settings."""
    if self.train_examples < 0:
      raise UsageError(f'--config.data.train_examples={self.train_examples} '
                       'must be at least 0 (0: the whole train split).')
    if self.name not in builders.BUILDERS:
      raise UsageError(f'--config.data.name={self.name!r} is unknown; use '
                       f'one of {", ".join(builders.BUILDERS)}.')
    if self.name == 'arithmetic':
      builders.arithmetic_config(**dict(self.arithmetic))
    if self.name in builders.SYNTHETIC and self.manual_dir:
      raise UsageError(f'--config.data.manual_dir={self.manual_dir!r} is '
                       f'not read by the {self.name} dataset; name the '
                       "JSONL's kind in --config.data.name (gsm8k, chat, "
                       'preferences, unpaired, code).')
    elif self.name not in builders.SYNTHETIC and not self.manual_dir and checks.scope().data:
      raise UsageError(f'--config.data.manual_dir is required for '
                       f'{self.name}: a directory with train.jsonl and '
                       'test.jsonl.')

  def builder(self) -> tfds.core.DatasetBuilder:
    self.check()
    if self.name == 'arithmetic':
      config = builders.arithmetic_config(**dict(self.arithmetic))
    elif self.name == 'bars':
      config = None  # one fixed set
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
  sources = dict(builder.as_data_source())
  if spec.train_examples:
    sources['train'] = _Head(sources['train'], spec.train_examples)
  return sources, skipped


class _Head:
  """The first `n` examples of a random-access source."""

  def __init__(self, source: Any, n: int):
    self._source, self._n = source, min(n, len(source))

  def __len__(self) -> int:
    return self._n

  def __getitem__(self, index: int) -> Any:
    if not 0 <= index < self._n:
      raise IndexError(index)
    return self._source[index]


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
  """[B, length] tokens, loss_mask, segment_ids (0 = padding), positions;
  and examples with images, each row's [most images, C, H, W] (zeros
  after its own)."""
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
  out = dict(tokens=tokens, loss_mask=loss_mask, segment_ids=segments,
             positions=positions)
  if 'images' in examples[0]:
    most = max(len(ex['images']) for ex in examples)
    out['images'] = np.zeros((batch, most) + examples[0]['images'].shape[1:],
                             np.float32)
    for i, ex in enumerate(examples):
      out['images'][i, :len(ex['images'])] = ex['images']
  return out


def check_eval_batch(source: Any, batch_size: int, what: str) -> None:
  """A held-out split must fill one evaluation batch (a one-pass pipeline
  drops the last partial batch)."""
  if len(source) < batch_size:
    raise UsageError(f'{what} has {len(source)} examples, fewer than one '
                     f'evaluation batch (--config.eval_batch_size='
                     f'{batch_size}); lower it.')


class Pipeline:
  """Batches of one split for this process, seeded and resumable on any
  process count.

  The split is shuffled into one global stream (reshuffled each epoch) and
  dealt round-robin into `batch_size` data shards: shard s reads global
  positions s, s + batch_size, ... and gives one example (or one packed row)
  to each global batch. A process reads the shards of its rows (its
  contiguous block of the batch, as `place` lays rows out), so the position of every shard, and the saved
  state, mean the same on any number of processes that divides the batch.

  transform(example, counters) -> model input (or None to drop it);
  batch_fn(list) -> batch. Examples are transformed in this thread, as they
  are consumed, so the counters and the resumable state agree exactly.
  `pack_length` > 0 packs each shard's examples into rows of that length
  (grain's first-fit packing: segment ids and positions per row). An empty
  split, or (endless streams) a shard that drops as many examples in a row
  as the split holds, is a UsageError naming `what` (the split) and
  `dropping` (the filter): the stream would otherwise spin forever."""

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
    if not len(source):
      raise UsageError(f'{what} has no examples.')
    self.local_batch, self._batch_size = batch_size // process_count, batch_size
    self.shards = list(range(process_index * self.local_batch,
                             (process_index + 1) * self.local_batch))
    self._counters = {s: Counters() for s in self.shards}
    self._batch_fn = _packed_batch if pack_length else batch_fn or list
    self._source, self._transform = source, transform
    self._what, self._dropping = what, dropping
    self._endless = num_epochs is None
    # Examples read in a row that were dropped (over this process's shards:
    # an all-dropping filter stops after one pass's worth of reads, not
    # one per shard).
    self._in_a_row = 0
    self._stream = grain.MapDataset.range(len(source)).shuffle(
        seed=seed).repeat(num_epochs, reseed_each_epoch=True)
    # Unpacked, each shard is its position in its stream (grain's iterator
    # state, the same saved form); packed, grain's packer over the stream.
    self._next = {s: 0 for s in self.shards}
    self._packers = {s: iter(grain.experimental.FirstFitPackIterDataset(
        self._stream[s::batch_size].map(
            lambda i, s=s: self._checked(s, i, source[i])).to_iter_dataset(
                grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
            ).filter(lambda x: x is not None),
        length_struct=dict(tokens=pack_length, loss_mask=pack_length),
        num_packing_bins=PACKING_BINS, seed=seed + s))
                     for s in self.shards} if pack_length else {}

  def _checked(self, s: int, i: int, record: Any) -> Any:
    """Shard `s`'s next example (split index `i`) transformed, or None
    (dropped); each example carries its index in the split ('index')."""
    out = self._transform(dict(builders.decode(record), index=i),
                          self._counters[s])
    self._in_a_row = 0 if out is not None else self._in_a_row + 1
    if self._in_a_row >= len(self._source) and self._endless:
      raise UsageError(f'{len(self._source)} examples of {self._what} in a '
                       f'row were dropped: {self._dropping}.')
    return out

  def _rows(self) -> list[Any]:
    """One row per shard: each round reads the next example of every shard
    still without one in one batched read (tfds's `__getitems__`)."""
    rows, waiting, size = {}, list(self.shards), self._batch_size
    while waiting:
      positions = [s + self._next[s] * size for s in waiting]
      if max(positions) >= len(self._stream):
        raise StopIteration
      indices = [self._stream[p] for p in positions]
      for s, i, record in zip(waiting, indices, _read(self._source, indices)):
        self._next[s] += 1
        out = self._checked(s, i, record)
        if out is not None:
          rows[s] = out
      waiting = [s for s in waiting if s not in rows]
    return [rows[s] for s in self.shards]

  @property
  def counters(self) -> Counters:
    """This process's counters: the sums over its shards."""
    return Counters(*(sum(getattr(c, f.name) for c in self._counters.values())
                      for f in dataclasses.fields(Counters)))

  def __iter__(self):
    return self

  def _count_the_rest(self) -> None:
    """At the end of a finite stream: every example left, transformed
    (counted), so the counters cover the whole pass."""
    for s in self.shards:
      if self._packers:
        for _ in self._packers[s]:
          pass
        continue
      while (p := s + self._next[s] * self._batch_size) < len(self._stream):
        self._next[s] += 1
        self._checked(s, self._stream[p], self._source[self._stream[p]])

  def __next__(self):
    try:
      rows = ([next(self._packers[s]) for s in self.shards] if self._packers
              else self._rows())
    except StopIteration:
      self._count_the_rest()
      raise
    return self._batch_fn(rows)

  def state(self) -> dict[str, Any]:
    """The position of this process's shards, by shard (the checkpoint
    merges every process's)."""
    return dict(batch_size=self._batch_size, shards={
        str(s): dict(grain=self._packers[s].get_state() if self._packers
                     else dict(next_index=self._next[s]),
                     counters=dataclasses.asdict(self._counters[s]))
        for s in self.shards})

  def restore(self, state: dict[str, Any]) -> None:
    if state.get('batch_size') != self._batch_size:
      raise UsageError(
          f'the data position was saved for a global batch of '
          f'{state.get("batch_size")} examples, not {self._batch_size}; '
          'resume with the batch size that wrote it.')
    for s in self.shards:
      position = state['shards'][str(s)]['grain']
      if self._packers:
        self._packers[s].set_state(position)
      else:
        self._next[s] = position['next_index']
      self._counters[s] = Counters(**state['shards'][str(s)]['counters'])


def _read(source: Any, indices: list[int]) -> list[Any]:
  getitems = getattr(source, '__getitems__', None)
  return getitems(indices) if getitems else [source[i] for i in indices]


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
