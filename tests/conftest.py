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


# The suite runs on 2 xdist workers (pyproject.toml's addopts): each test
# file is one unit of work, so that its module fixtures are built once, and
# the files that share `trained_sft` are one unit together; the longest
# units (measured: about 370, 290, 195, 165, 150 and 60 s alone) go first,
# so that no worker runs a long one alone at the end.
TRAINED_SFT = ('tests/jobs/test_trainers.py', 'tests/jobs/test_reward_model.py',
               'tests/rl/test_judge.py')
LONGEST = ('trained_sft', 'tests/jobs/test_grpo.py',
           'tests/test_compile_only.py', 'tests/jobs/test_distill.py',
           'tests/jobs/test_demo.py', 'tests/jobs/test_golden.py')


def pytest_collection_modifyitems(items):
  def group(item):
    path = item.nodeid.split('::')[0]
    return 'trained_sft' if path in TRAINED_SFT else path

  for item in items:
    item.add_marker(pytest.mark.xdist_group(group(item)))
  items.sort(key=lambda item: LONGEST.index(group(item))
             if group(item) in LONGEST else len(LONGEST))
