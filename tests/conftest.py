"""Test setup: JAX on CPU with 8 virtual devices, before JAX starts."""

import json
import os
import subprocess
import sys

os.environ['JAX_PLATFORMS'] = 'cpu'  # libtpu may be installed (test extra)
# Make the repository root importable (launch/, benchmarks/).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import filelock  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from tests import helpers, tiers  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.configs import common  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.runtime import allocator, backend  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_num_cpu_devices', 8)
# The xdist workers start after this: under TCMalloc, as the jobs run (the
# jobs then need no re-execution; tests/runtime/test_allocator.py checks it).
os.environ.update(allocator.preloaded(os.environ) or {})
# The tests in this process share compiled programs with each other, with
# the other worker and with the jobs the tests run (main's default cache).
backend.cache_compiled_programs(common.runtime().compilation_cache_dir)


@pytest.fixture(scope='session')
def trained_sft(tmp_path_factory):
  """A tiny model SFT-trained on 2-digit additions on one device until an
  evaluation (every 100 steps) finds it 90% right on held-out problems
  (about 700 steps of at most 1,000; about 60 s): the completed run and
  its workdir, shared by the tests that need a model that is often right.
  Under xdist the first worker to need it trains it and the others wait
  for it (a file lock in the run's shared temporary directory)."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):
    root = root.parent  # shared by this run's workers
  workdir, record = root / 'trained_sft', root / 'trained_sft.json'
  with filelock.FileLock(str(root / 'trained_sft.lock')):
    if not record.exists():
      result = helpers.run_main(*helpers.TRAINED_SFT, f'--workdir={workdir}',
                                timeout=600)
      record.write_text(json.dumps(dict(
          returncode=result.returncode, stdout=result.stdout,
          stderr=result.stderr)))
  return subprocess.CompletedProcess(
      args=(), **json.loads(record.read_text())), workdir


# The suite runs on 2 xdist workers (pyproject.toml's addopts), each test
# file whole on one of them, so that its module fixtures are built once;
# the longest files (measured: about 290, 195, 165, 150 and 125 s alone,
# then about 100 s each) go first, so that no worker runs a long one alone
# at the end, the one that trains `trained_sft` first of all (the others
# that share it come later).
LONGEST = ('tests/jobs/test_reward_model.py', 'tests/jobs/test_grpo.py',
           'tests/test_compile_only.py', 'tests/jobs/test_distill.py',
           'tests/jobs/test_demo.py', 'tests/jobs/test_trainers.py',
           'tests/test_gcs.py', 'tests/test_faults.py',
           'tests/launch/test_local.py')


def pytest_configure(config):
  config.addinivalue_line(
      'markers', 'slow: over 2 s in a full run (tests/tiers.py); '
      '-m "not slow" is the fast tier')


def pytest_collection_modifyitems(items):
  slow = tiers.listed()
  for item in items:  # a trained model takes a minute to make
    if item.nodeid in slow or 'trained_sft' in item.fixturenames:
      item.add_marker(pytest.mark.slow)
  rank = lambda item: item.nodeid.split('::')[0]
  items.sort(key=lambda item: LONGEST.index(rank(item))
             if rank(item) in LONGEST else len(LONGEST))
