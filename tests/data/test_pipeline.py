"""Pipelines: seeded order, exactly-once epochs, resume in a fresh process,
per-process shares of a real two-process run, packing."""

import dataclasses
import functools
import json
import subprocess
import sys

import grain
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import numpy as np
import pytest

from tests import helpers
from tunix_pw.configs import common
from tunix_pw.data import formats, pipeline
from tunix_pw.errors import UsageError
from tunix_pw.models import checkpoints, presets
from tunix_pw.models.tokenizers import CharTokenizer
from tunix_pw.train import checkpoint

ARITH = dict(digits=2, operations='+-', train_size=300, test_size=60, seed=0)


def spec(data_dir):
  return pipeline.DataSpec('arithmetic', str(data_dir),
                           arithmetic=tuple(ARITH.items()))


@pytest.fixture(scope='module')
def sources(tmp_path_factory):
  return pipeline.prepare(spec(tmp_path_factory.mktemp('tfds')))[0]


def indices(source, seed, epochs=1, batch=10):
  reader = pipeline.Pipeline(source, lambda ex, c: ex['index'],
                             batch_size=batch, seed=seed, num_epochs=epochs)
  return [i for b in reader for i in b]


def test_seeded_order_and_exactly_once_per_epoch(sources):
  train = sources['train']
  a, b, c = indices(train, 0), indices(train, 0), indices(train, 1)
  assert a == b and a != c
  assert sorted(a) == list(range(len(train))) == sorted(c)
  two = indices(train, 0, epochs=2)
  assert sorted(two[:300]) == sorted(two[300:]) == list(range(300))
  assert two[:300] != two[300:]  # reshuffled each epoch


def test_shards_read_grains_stream_with_drops_refilled_and_saved_as_grain(
    sources):
  """Shard s reads positions s, s + B, ... of grain's seeded shuffle (the
  same examples, and the same saved position, as grain's iterators, which
  earlier checkpoints hold); a dropped example is replaced by the shard's
  next one."""
  train, size = sources['train'], 8
  stream = grain.MapDataset.range(len(train)).shuffle(seed=3).repeat(
      None, reseed_each_epoch=True)
  odd = lambda ex, c: ex['index'] if ex['index'] % 2 else None
  reader = pipeline.Pipeline(train, odd, batch_size=size, seed=3,
                             num_epochs=None)
  batches = [next(reader) for _ in range(5)]
  for s in range(size):
    read = [stream[p] for p in range(s, 60 * size, size)]
    kept = [i for i in read if i % 2]
    assert [b[s] for b in batches] == kept[:5]
    assert reader.state()['shards'][str(s)]['grain'] == dict(
        next_index=read.index(kept[4]) + 1)


def test_train_examples_limits_the_train_split_alone(sources, tmp_path):
  """The data-limited regime: the first N train examples, the test split
  whole; a pipeline over them reads those N and no others."""
  limited, _ = pipeline.prepare(dataclasses.replace(
      spec(tmp_path), train_examples=40))
  assert len(limited['train']) == 40
  assert len(limited['test']) == len(sources['test'])
  assert sorted(indices(limited['train'], 0)) == list(range(40))
  assert [pipeline.builders.decode(limited['train'][i]) for i in range(40)] \
      == [pipeline.builders.decode(sources['train'][i]) for i in range(40)]
  with pytest.raises(IndexError):
    limited['train'][40]  # pylint: disable=pointless-statement
  with pytest.raises(UsageError, match='train_examples=-1 must be at least'):
    dataclasses.replace(spec(tmp_path), train_examples=-1).check()


def test_train_and_test_are_disjoint(sources):
  def questions(split):
    return {pipeline.builders.decode(sources[split][i])['question']
            for i in range(len(sources[split]))}
  assert not questions('train') & questions('test')
  example = pipeline.builders.decode(sources['train'][0])
  a, op, b = example['question'][:2], example['question'][2], \
      example['question'][3:5]
  assert int(example['answer']) == (int(a) + int(b) if op == '+'
                                    else int(a) - int(b))


RESUME = '''
import json, sys
from tunix_pw.data import pipeline
spec = pipeline.DataSpec('arithmetic', sys.argv[1],
                         arithmetic=tuple(json.loads(sys.argv[2]).items()))
source = pipeline.prepare(spec)[0]['train']
reader = pipeline.Pipeline(source, lambda ex, c: ex['index'], batch_size=16,
                           seed=3, num_epochs=2)
reader.restore(json.loads(open(sys.argv[3]).read()))
print(json.dumps([i for b in reader for i in b]))
'''


def test_resume_in_a_fresh_process_continues_exactly(sources, tmp_path):
  data_dir = tmp_path / 'tfds'
  source = pipeline.prepare(spec(data_dir))[0]['train']
  reader = pipeline.Pipeline(source, lambda ex, c: ex['index'],
                             batch_size=16, seed=3, num_epochs=2)
  taken = [next(reader) for _ in range(7)]
  (tmp_path / 'state.json').write_text(json.dumps(reader.state()))
  rest = [i for b in reader for i in b]
  out = subprocess.run(
      [sys.executable, '-c', RESUME, str(data_dir), json.dumps(ARITH),
       str(tmp_path / 'state.json')], capture_output=True, text=True,
      env=helpers.env(), check=True)
  assert json.loads(out.stdout.splitlines()[-1]) == rest
  assert len(taken) * 16 + len(rest) == 2 * 300 // 16 * 16
  del sources


def shards_of(source, processes, transform=lambda ex, c: ex['index']):
  return [pipeline.Pipeline(source, transform, batch_size=8, seed=5,
                            num_epochs=None, process_index=p,
                            process_count=processes)
          for p in range(processes)]


def global_batch(readers):
  """The rows of one global batch by data shard, as `place` lays them."""
  rows = {}
  for reader in readers:
    rows.update(zip(reader.shards, next(reader)))
  return [rows[s] for s in sorted(rows)]


@pytest.mark.parametrize('before,after', [(2, 1), (1, 4), (4, 2)])
def test_the_data_position_resumes_on_another_process_count(
    sources, before, after):
  # Dropping long examples makes shards advance unevenly: positions differ.
  tok = CharTokenizer()
  sft = formats.sft_transform('arithmetic', tok, 10, 'drop', False)
  transform = lambda ex, c: (lambda out: out and ex['index'])(sft(ex, c))
  source = sources['train']
  whole = shards_of(source, 1, transform)
  expected = [global_batch(whole) for _ in range(12)]
  first = shards_of(source, before, transform)
  assert [global_batch(first) for _ in range(5)] == expected[:5]
  saved = functools.reduce(checkpoint._union, [r.state() for r in first])
  resumed = shards_of(source, after, transform)
  for reader in resumed:
    reader.restore(json.loads(json.dumps(saved)))
  assert [global_batch(resumed) for _ in range(7)] == expected[5:]
  assert (sum(r.counters.dropped for r in resumed) ==
          sum(r.counters.dropped for r in whole) > 0)


def test_without_drops_the_batches_are_the_global_stream(sources):
  source = sources['train']
  reader, readers = shards_of(source, 1), shards_of(source, 4)
  one = [i for _ in range(40) for i in global_batch(reader)]
  four = [i for _ in range(40) for i in global_batch(readers)]
  assert one == four  # 320 > 300: into the second epoch
  assert sorted(one[:300]) == list(range(300))
  with pytest.raises(UsageError, match='global batch of 8'):
    pipeline.Pipeline(source, lambda ex, c: ex, batch_size=16, seed=5,
                      num_epochs=None).restore(readers[0].state())


def test_two_processes_read_disjoint_shares_of_the_whole_split(tmp_path):
  result = helpers.launch_local(
      2, '--config=tunix_pw/configs/data.py', '--config.dump=True',
      '--config.batch_size=40', f'--config.data.data_dir={tmp_path / "tfds"}',
      f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stdout + result.stderr
  shares = [set(json.loads((tmp_path / f'data_p{i}.json').read_text())
                ['indices']) for i in range(2)]
  assert not shares[0] & shares[1]
  assert shares[0] | shares[1] == set(range(5000))


def test_overlong_examples_are_truncated_or_dropped_and_counted(sources):
  tok = CharTokenizer()
  for overlong, expected_len in (('truncate', 8), ('drop', None)):
    transform = formats.sft_transform('arithmetic', tok, 8, overlong, False)
    reader = pipeline.Pipeline(sources['train'], transform, batch_size=10,
                               seed=0, num_epochs=1)
    batches = list(reader)
    if expected_len:
      assert all(len(ex['tokens']) == 8 for b in batches for ex in b)
      assert reader.counters.truncated == 300
    else:
      assert not batches and reader.counters.dropped == 300


def test_an_endless_stream_dropping_everything_stops_after_one_split(sources):
  """A filter that drops every example is named once the pipeline has read
  a split's worth in a row over all its shards, not a split's worth each."""
  transform = formats.sft_transform('arithmetic', CharTokenizer(), 4, 'drop',
                                    False)
  reader = pipeline.Pipeline(sources['train'], transform, batch_size=10,
                             seed=0, num_epochs=None)
  with pytest.raises(UsageError, match='300 examples of .* in a row'):
    next(reader)
  assert reader.counters.dropped == 300


@pytest.mark.parametrize('pack_length', [0, 40])
def test_a_finite_pass_counts_every_example_packed_or_not(sources,
                                                          pack_length):
  """The last, partial batch is not given, but its examples (and every one
  after it in the other shards) are counted: the counters cover the pass."""
  train = sources['train']
  transform = formats.sft_transform('arithmetic', CharTokenizer(), 32,
                                    'drop', False)
  reader = pipeline.Pipeline(train, transform, batch_size=16, seed=0,
                             num_epochs=1, pack_length=pack_length)
  assert sum(1 for _ in reader) > 0
  assert reader.counters.examples == len(train)


def test_packing_positions_segments_and_equal_loss(sources):
  tok = CharTokenizer()
  transform = formats.sft_transform('arithmetic', tok, 32, 'drop', False)
  packed = next(pipeline.Pipeline(sources['train'], transform, batch_size=2,
                                  seed=0, num_epochs=1, pack_length=40))
  rows = []
  for r in range(2):
    seg, pos = packed['segment_ids'][r], packed['positions'][r]
    for s in sorted(set(seg.tolist()) - {0}):
      where = np.flatnonzero(seg == s)
      assert (np.diff(where) == 1).all()  # contiguous
      assert pos[where].tolist() == list(range(len(where)))
      rows.append(dict(tokens=packed['tokens'][r][where],
                       loss_mask=packed['loss_mask'][r][where]))
  unpacked = pipeline.pad_batch(rows, 40, 0)

  model = checkpoints.init(presets.PRESETS['tiny-gemma2'], seed=0)

  def loss_sum(batch):
    logits, _ = model(jnp.asarray(batch['tokens']),
                      jnp.asarray(batch['positions']),
                      jnp.asarray(batch['segment_ids']))
    logp = jax.nn.log_softmax(logits[:, :-1])
    nll = -jnp.take_along_axis(logp, batch['tokens'][:, 1:, None], -1)[..., 0]
    # A token is predicted from the previous one in the same segment.
    same = batch['segment_ids'][:, 1:] == batch['segment_ids'][:, :-1]
    return float((nll * batch['loss_mask'][:, 1:] * same).sum())

  assert len(rows) > 2  # really packed several per row
  np.testing.assert_allclose(loss_sum(packed), loss_sum(unpacked), rtol=1e-5)


def test_place_puts_local_rows_on_the_mesh(sources):
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ('fsdp', 'tp'))
  batch = pipeline.pad_batch([dict(tokens=np.arange(5), loss_mask=np.ones(5))]
                             * 8, 16, 0)
  placed = pipeline.place(batch, mesh, common.sharding())
  assert placed['tokens'].shape == (8, 16)
  assert placed['tokens'].sharding.spec[0] == 'fsdp'
  np.testing.assert_array_equal(placed['tokens'], batch['tokens'])
  del sources
