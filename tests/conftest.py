"""Test setup: JAX on CPU with 8 virtual devices, before JAX starts."""

import os
import sys

os.environ['JAX_PLATFORMS'] = 'cpu'  # libtpu may be installed (test extra)
# Make the repository root importable (launch/, benchmarks/).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from tests import helpers  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_num_cpu_devices', 8)


@pytest.fixture(scope='session')
def trained_sft(tmp_path_factory):
  """A tiny model SFT-trained on 2-digit additions (1,000 steps, one
  device, about 90 s): the completed run and its workdir, shared by the
  tests that need a model that is often right."""
  workdir = tmp_path_factory.mktemp('trained_sft')
  result = helpers.run_main(
      '--config=tunix_pw/configs/sft.py:runlocal',
      '--config.runtime.host_device_count=1',
      '--config.meshes.actor.axes=fsdp=1', '--config.steps=1000',
      '--config.log_every=100', '--config.checkpoint.every=0',
      f'--workdir={workdir}', timeout=600)
  return result, workdir
