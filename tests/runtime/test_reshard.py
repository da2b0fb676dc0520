"""reshard.transfer: bit-identical values on every path, donation, PRNG keys,
chunked big leaves, plan caching, and the Pathways rung with only its lowest
pathwaysutils call faked."""

import concurrent.futures
import json
import logging

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np
from pathwaysutils import plugin_executable
import pytest

from tests import helpers
from tunix_pw.runtime import backend, reshard, two_hop

DEVICES = jax.devices()
LOCAL = backend.Runtime(backend.LOCAL, 'test', 0, 1, tuple(DEVICES))
PATHWAYS = backend.Runtime(backend.PATHWAYS, 'test', 0, 1, tuple(DEVICES))


def mesh(ids, shape, names=('fsdp', 'tp')):
  return Mesh(np.array([DEVICES[i] for i in ids]).reshape(shape), names)


FSDP4 = NamedSharding(mesh(range(4), (4, 1)), P('fsdp', None))
TP4_SAME = NamedSharding(mesh(range(4), (1, 4)), P(None, 'tp'))
TP4_OTHER = NamedSharding(mesh(range(4, 8), (1, 4)), P(None, 'tp'))
FSDP8 = NamedSharding(mesh(range(8), (8, 1)), P('fsdp', None))
TP8 = NamedSharding(mesh(range(8), (1, 8)), P(None, 'tp'))
REPLICATED4 = NamedSharding(mesh(range(4), (4, 1)), P())

CASES = {
    'fsdp->tp': (FSDP4, TP4_SAME),
    'tp->fsdp': (TP4_SAME, FSDP4),
    'devices 0-3 -> 4-7': (FSDP4, TP4_OTHER),
    '8 devices -> 4': (FSDP8, TP4_OTHER),
    '4 devices -> 8': (FSDP4, TP8),
    'replicated -> sharded': (REPLICATED4, TP4_OTHER),
    'overlapping devices': (FSDP4, NamedSharding(mesh([0, 1, 6, 7], (4, 1)),
                                                 P('fsdp', None))),
    'same devices, another order': (FSDP4, NamedSharding(
        mesh([3, 2, 1, 0], (1, 4)), P(None, 'tp'))),
}
PATH = {'same devices, another order': reshard.DEVICE_PUT}


def host_tree(seed=0):
  rng = np.random.default_rng(seed)
  # Odd bit patterns too: -0.0, NaN and denormals must survive bit for bit.
  special = np.array([-0.0, np.nan, 1e-45, np.inf] * 8, np.float32)
  return {'w': rng.standard_normal((16, 32)).astype(np.float32),
          'b': np.resize(special, (8, 8)).copy()}


def place(tree, sharding):
  return jax.tree.map(lambda x: jax.device_put(x, sharding), tree)


def assert_bits_equal(moved, expected):
  for got, want in zip(jax.tree.leaves(moved), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32),
                                  want.view(np.uint32))


@pytest.mark.parametrize('name', list(CASES))
@pytest.mark.parametrize('donate', [False, True])
def test_values_are_bit_identical_and_donation_frees(name, donate):
  source_sharding, target = CASES[name]
  host = host_tree()
  source = place(host, source_sharding)
  moved, stats = reshard.transfer(source, target, LOCAL, donate=donate)
  assert_bits_equal(moved, host)
  assert stats.path == PATH.get(name, reshard.TWO_HOP)
  assert stats.bytes == sum(x.nbytes for x in jax.tree.leaves(host))
  for x in jax.tree.leaves(moved):
    assert x.sharding == target
  assert all(x.is_deleted() == donate for x in jax.tree.leaves(source))


def test_prng_key_leaves_move_and_stay_keys():
  key = jax.random.key(7)
  tree = {'key': jax.jit(lambda: jax.random.key(7),
                         out_shardings=REPLICATED4)(),
          'w': jax.device_put(host_tree()['w'], FSDP4)}
  moved, _ = reshard.transfer(tree, {'key': NamedSharding(TP4_OTHER.mesh, P()),
                                     'w': TP4_OTHER}, LOCAL, donate=True)
  assert jax.dtypes.issubdtype(moved['key'].dtype, jax.dtypes.prng_key)
  np.testing.assert_array_equal(jax.random.key_data(moved['key']),
                                jax.random.key_data(key))
  np.testing.assert_array_equal(jax.random.normal(moved['key'], (3,)),
                                jax.random.normal(key, (3,)))
  assert tree['key'].is_deleted() and tree['w'].is_deleted()


def test_big_stacked_leaf_moves_in_chunks_bit_identical():
  # [layers, d, f]: the layer axis is unsharded on both sides.
  src = NamedSharding(mesh(range(4), (4, 1)), P(None, 'fsdp', None))
  dst = NamedSharding(mesh(range(4, 8), (1, 4)), P(None, None, 'tp'))
  host = np.random.default_rng(1).standard_normal((6, 16, 64)).astype(
      np.float32)
  x = jax.device_put(host, src)
  budget = 2 * host.nbytes // 6  # two layers per chunk
  assert two_hop.chunk_rows(x, dst, budget) == 2
  moved, stats = reshard.transfer({'w': x}, {'w': dst}, LOCAL, donate=True,
                                  budget=reshard.Budget(budget))
  np.testing.assert_array_equal(np.asarray(moved['w']), host)
  assert moved['w'].sharding == dst and x.is_deleted()
  assert stats.groups == 1


def test_groups_respect_the_byte_budget():
  host = {f'w{i}': np.full((16, 16), i, np.float32) for i in range(6)}
  source = place(host, FSDP4)
  moved, stats = reshard.transfer(source, TP4_OTHER, LOCAL,
                                  budget=reshard.Budget(2 * 16 * 16 * 4))
  assert stats.groups == 3
  assert_bits_equal(moved, host)


def test_plans_are_compiled_once_per_shape_and_sharding():
  two_hop.plan_leaf.cache_clear()
  for seed in range(3):
    host = host_tree(seed)
    moved, _ = reshard.transfer(place(host, FSDP4), TP4_OTHER, LOCAL)
    assert_bits_equal(moved, host)
  info = two_hop.plan_leaf.cache_info()
  assert info.misses == 2  # one per distinct leaf shape
  assert info.hits >= 4


class FakePluginExecutable:
  """Stands in for the one call that needs a Pathways backend: the IFRT
  plugin program. Everything above it (pathwaysutils' grouping and plan
  cache, our rung) runs for real."""

  requests = []
  fail = False

  def __init__(self, prog_str):
    if FakePluginExecutable.fail:
      raise RuntimeError('no Pathways proxy here')
    self.request = json.loads(prog_str)['reshardRequest']
    FakePluginExecutable.requests.append(self.request)

  def call(self, in_arr, out_shardings, out_avals, out_committed=True):
    del out_avals, out_committed
    out = [jax.device_put(x, s, may_alias=False)
           for x, s in zip(in_arr, out_shardings)]
    if self.request['donateInput']:
      for x in in_arr:
        x.delete()
    done = concurrent.futures.Future()
    done.set_result(None)
    return out, done


@pytest.fixture
def fake_pathways(monkeypatch):
  FakePluginExecutable.requests = []
  FakePluginExecutable.fail = False
  monkeypatch.setattr(plugin_executable, 'PluginExecutable',
                      FakePluginExecutable)
  return FakePluginExecutable


@pytest.mark.parametrize('donate', [False, True])
def test_pathways_rung_runs_pathwaysutils_with_its_plan_cache(fake_pathways,
                                                              donate):
  host = host_tree()
  for _ in range(2):
    source = place(host, FSDP8)
    moved, stats = reshard.transfer(source, TP4_OTHER, PATHWAYS,
                                    donate=donate)
    assert stats.path == reshard.PATHWAYS
    assert_bits_equal(moved, host)
    assert all(x.is_deleted() == donate for x in jax.tree.leaves(source))
  # One plan (both leaves share a device set), built once, reused.
  assert len(fake_pathways.requests) == 1
  request = fake_pathways.requests[0]
  assert request['donateInput'] is donate
  assert len(request['inSharding']) == 2


def test_pathways_never_takes_a_fully_replicated_intermediate():
  from pathwaysutils import reshard as pw  # pylint: disable=g-import-not-at-top
  # fsdp8 -> tp4: pathwaysutils' answer replicates the whole array.
  intermediate, _ = pw.find_intermediate_sharding(FSDP8, TP4_OTHER)
  assert intermediate.is_fully_replicated
  plan = two_hop.plan_leaf((16, 32), np.float32, FSDP8, TP4_OTHER)
  coarse_out = plan.coarsen.output_shardings
  assert not coarse_out.is_fully_replicated
  assert coarse_out.shard_shape((16, 32)) == (4, 32)  # 16 rows over 4


def test_pathways_failure_falls_back_to_two_hop(fake_pathways, caplog):
  fake_pathways.fail = True
  host = host_tree()
  with caplog.at_level(logging.WARNING):
    moved, stats = reshard.transfer(place(host, FSDP4), TP4_OTHER, PATHWAYS,
                                    donate=True)
  assert stats.path == reshard.TWO_HOP
  assert_bits_equal(moved, host)
  assert 'the pathways path failed' in caplog.text
  assert 'no Pathways proxy here' in caplog.text


def test_cross_process_transfer_in_a_two_process_run(tmp_path):
  """Actor on process 0's devices, rollout on process 1's: union_jit."""
  result = helpers.launch_local(2, '--config=tunix_pw/configs/smoke.py',
                                '--config.steps=2', f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stdout + result.stderr
  summary = json.loads((tmp_path / 'smoke_summary.json').read_text())
  assert summary['transfer']['transfer/path'] == reshard.UNION_JIT
  assert 'values verified' in result.stdout  # bit checksums on both sides
  single = helpers.run_main('--config=tunix_pw/configs/smoke.py',
                            '--config.steps=2', f'--workdir={tmp_path}/one')
  assert single.returncode == 0, single.stderr
  one = json.loads((tmp_path / 'one' / 'smoke_summary.json').read_text())
  assert one['transfer']['transfer/path'] == reshard.TWO_HOP
  # Gloo sums in another order than one process: equal within float noise.
  np.testing.assert_allclose(summary['losses'], one['losses'], atol=1e-6)
