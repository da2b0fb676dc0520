"""Role meshes: collocated and disaggregated layouts, the union mesh,
oversubscription, device grammar, and TPU topology descriptions."""

import jax
from jax.experimental import topologies
import pytest

from tests import helpers
from tunix_pw.configs import common
from tunix_pw.errors import UsageError
from tunix_pw.runtime import meshes


def ids(mesh):
  return [d.id for d in mesh.devices.flat]


def test_disaggregated_roles_get_disjoint_devices_and_a_union():
  config = common.meshes('disaggregated', actor=('fsdp=4,tp=1', '0:4'),
                         reference=('fsdp=-1', 'actor'),
                         rollout=('tp=-1', '50%:100%'))
  built = meshes.build(config, jax.devices())
  assert dict(built['actor'].shape) == {'fsdp': 4, 'tp': 1}
  assert ids(built['actor']) == [0, 1, 2, 3]
  assert ids(built['reference']) == [0, 1, 2, 3]
  assert dict(built['rollout'].shape) == {'tp': 4}
  assert ids(built['rollout']) == [4, 5, 6, 7]
  assert ids(built.union) == list(range(8))
  assert built.union.axis_names == (meshes.UNION_AXIS,)


def test_collocated_roles_share_devices_with_different_shapes():
  config = common.meshes('collocated', actor=('fsdp=4,tp=2', 'all'),
                         rollout=('fsdp=1,tp=8', 'all'))
  built = meshes.build(config, jax.devices())
  assert set(ids(built['actor'])) == set(ids(built['rollout'])) == set(range(8))
  assert built['rollout'].shape['tp'] == 8
  assert ids(built.union) == list(range(8))


def test_union_covers_only_used_devices():
  config = common.meshes('disaggregated', actor=('fsdp=2', '0:2'),
                         rollout=('tp=2', '6:8'))
  built = meshes.build(config, jax.devices())
  assert ids(built.union) == [0, 1, 6, 7]


@pytest.mark.parametrize('roles, layout, message', [
    (dict(actor=('fsdp=16', 'all')), 'collocated', 'needs 16 devices'),
    (dict(actor=('fsdp=4', '4:12')), 'collocated', 'the job has 8 devices'),
    (dict(actor=('fsdp=3,tp=-1', 'all')), 'collocated', 'multiply'),
    (dict(actor=('fsdp=4', '0:4'), rollout=('tp=4', '3:7')), 'disaggregated',
     'overlaps'),
    (dict(actor=('fsdp=4', '0:4'), rollout=('tp=4', '4:8')), 'collocated',
     'layout is collocated'),
    (dict(actor=('fsdp=8', 'slices:1:2')), 'collocated', 'no slice'),
    (dict(actor=('fsdp', 'all')), 'collocated', 'is not of the form'),
    (dict(actor=('fsdp=-1,tp=-1', 'all')), 'collocated', 'more than one -1'),
    (dict(actor=('fsdp=8', 'first')), 'collocated', 'is not'),
    (dict(actor=('fsdp=8', 'all'), rollout=('tp=8', 'ref'),
          ref=('tp=8', 'actor')), 'collocated', 'itself shares devices'),
])
def test_oversubscription_and_bad_specs_are_usage_errors(roles, layout,
                                                         message):
  with pytest.raises(UsageError, match=message):
    meshes.build(common.meshes(layout, **roles), jax.devices())


@helpers.needs_libtpu
def test_mesh_on_a_v5p_topology_description():
  topology = topologies.get_topology_desc(platform='tpu',
                                          topology_name='v5p:4x4x4')
  config = common.meshes('disaggregated', actor=('fsdp=16,tp=2', '0:32'),
                         rollout=('fsdp=4,tp=8', '32:64'))
  built = meshes.build(config, topology.devices)
  assert built['actor'].devices.shape == (16, 2)
  assert built['actor'].devices.flat[0].platform == 'tpu'
  assert not set(ids(built['actor'])) & set(ids(built['rollout']))
  assert len(built.union.devices) == 64


@helpers.needs_libtpu
def test_slices_select_whole_slices_on_a_multislice_topology():
  topology = topologies.get_topology_desc(platform='tpu',
                                          topology_name='v5p:2x2x2',
                                          num_slices=2)
  config = common.meshes('disaggregated', actor=('fsdp=8', 'slices:0:1'),
                         rollout=('data=2,tp=4', 'slices:1:2'))
  built = meshes.build(config, topology.devices)
  assert {d.slice_index for d in built['actor'].devices.flat} == {0}
  assert {d.slice_index for d in built['rollout'].devices.flat} == {1}
  both = meshes.build(common.meshes('collocated',
                                    actor=('data=2,fsdp=8', 'all')),
                      topology.devices)
  # Slices meet over DCN on the outer axis: each row is one slice.
  rows = both['actor'].devices
  assert [{d.slice_index for d in row} for row in rows] == [{0}, {1}]


@pytest.mark.parametrize('axes, message', [
    ('fsdp=4,expert=2', "the mesh axis 'expert', which no --config.sharding "
     'rule splits anything over'),
    ('fsdp=4,context=-1', "mesh axis 'context'"),
])
def test_an_axis_no_rule_uses_is_a_usage_error(axes, message):
  block = common.meshes('collocated', actor=(axes, 'all'))
  meshes.check(block)  # syntax alone: fine
  with pytest.raises(UsageError, match=message):
    meshes.check(block, rules=common.sharding())
  # Of size 1 it splits nothing either way; `sequence` is a rule's.
  for fine in ('fsdp=4,expert=1', 'fsdp=4,sequence=2', 'fsdp=4,stage=2'):
    meshes.check(common.meshes('collocated', actor=(fine, 'all')),
                 rules=common.sharding())


@pytest.mark.parametrize('axes, divides, message', [
    ('fsdp=2,sequence=4', {'sequence': {'--config.data.max_length': 18}},
     r'splits --config.data.max_length 4 ways, which does not divide it '
     r'\(18\); use a sequence size that divides 18'),
    ('fsdp=1,sequence=32', {'sequence': {'the shortest padded length': 16}},
     'splits the shortest padded length 32 ways'),
    ('fsdp=2,stage=4', {'stage': {'the repeated blocks': 6}},
     'splits the repeated blocks 4 ways'),
])
def test_an_axis_must_divide_what_it_splits(axes, divides, message):
  """A sequence axis the token lengths, a stage axis the layers."""
  block = common.meshes('collocated', actor=(axes, 'all'))
  with pytest.raises(UsageError, match=message):
    meshes.check(block, rules=common.sharding(), divides=divides)
  meshes.check(block, rules=common.sharding(), divides={
      axis: {k: 64 for k in counts} for axis, counts in divides.items()})
