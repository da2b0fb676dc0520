"""XPK's TPU type names -> chips, HBM and jax topology descriptions."""

import pytest

from tests import helpers
from tunix_pw.errors import UsageError
from tunix_pw.runtime import topology


@pytest.mark.parametrize('name, chips, hbm_gib, jax_name', [
    ('v5p-8', 4, 95, 'v5p:2x2x1'),
    ('v5p-128', 64, 95, 'v5p:4x4x4'),
    ('v5p-2048', 1024, 95, 'v5p:8x8x16'),
    ('v5p-4096', 2048, 95, 'v5p:8x16x16'),
    ('v4-16', 8, 32, 'v4:2x2x2'),
    ('v5litepod-16', 16, 16, 'v5e:4x4'),
    ('v5litepod-256', 256, 16, 'v5e:16x16'),
    ('v6e-8', 8, 32, 'v6e:2x4'),
    ('v6e-256', 256, 32, 'v6e:16x16'),
])
def test_xpk_names(name, chips, hbm_gib, jax_name):
  tpu = topology.parse(name)
  assert (tpu.chips, tpu.hbm_bytes, tpu.topology) == (
      chips, hbm_gib << 30, jax_name)


@pytest.mark.parametrize('name, says', [
    ('v5p128', 'not a TPU type XPK knows'),
    ('v7x-64', 'not a TPU type XPK knows'),
    ('v5p-96', 'powers of two from 8 to 8192'),
    ('v5p-4', 'powers of two from 8 to 8192'),
    ('v5litepod-512', 'powers of two from 4 to 256'),
])
def test_bad_names_are_one_sentence(name, says):
  with pytest.raises(UsageError, match=says):
    topology.parse(name, '--compile_topology')


@helpers.needs_libtpu
def test_devices_of_several_slices():
  """libtpu describes every device of the slices, no TPU needed."""
  devices = topology.devices(topology.parse('v5litepod-16'), num_slices=2)
  assert len(devices) == 32
  assert {d.slice_index for d in devices} == {0, 1}
  assert {d.platform for d in devices} == {'tpu'}
  with pytest.raises(UsageError, match='at least 1'):
    topology.devices(topology.parse('v5litepod-16'), num_slices=0)
