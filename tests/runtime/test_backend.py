"""Environment -> backend and process id, for every cluster flavour."""

import os
import subprocess
import sys

import pytest

from tests import helpers
from tunix_pw.errors import UsageError
from tunix_pw.runtime import backend

CPU_POD = dict(JAX_COORDINATOR_ADDRESS='job-slice-0-0.job',
               JAX_PROCESS_COUNT='8', PROCESSES_IN_JOB='4')


@pytest.mark.parametrize('env, flags, expected', [
    ({}, {}, ('local', None, 1, 0)),
    ({'JAX_PLATFORMS': 'proxy'}, {}, ('pathways', None, 1, 0)),
    ({'JAX_PLATFORMS': 'cpu,proxy', **CPU_POD}, {}, ('pathways', None, 1, 0)),
    # XPK CPU JobSet: id = JOB_INDEX * PROCESSES_IN_JOB + JOB_COMPLETION_INDEX.
    ({**CPU_POD, 'JOB_INDEX': '1', 'JOB_COMPLETION_INDEX': '2'}, {},
     ('multi_controller', 'job-slice-0-0.job:1234', 8, 6)),
    ({**CPU_POD, 'JAX_COORDINATOR_ADDRESS': 'h:99', 'JOB_INDEX': '0',
      'JOB_COMPLETION_INDEX': '3'}, {}, ('multi_controller', 'h:99', 8, 3)),
    # XPK GPU JobSet.
    ({'JAX_COORDINATOR_ADDRESS': 'g-0-0.g', 'JAX_COORDINATOR_PORT': '6002',
      'NNODES': '4', 'NODE_RANK': '3'}, {},
     ('multi_controller', 'g-0-0.g:6002', 4, 3)),
    # TPU pod slice: 4 hosts.
    ({'TPU_WORKER_HOSTNAMES': 'h0,h1,h2,h3', 'TPU_WORKER_ID': '2'}, {},
     ('multi_controller', 'h0:8476', 4, 2)),
    # Multi-slice TPU: 2 slices of 4 hosts; slice 1, worker 3 -> id 7.
    ({'TPU_WORKER_HOSTNAMES': 'h0,h1,h2,h3', 'TPU_WORKER_ID': '3',
      'MEGASCALE_NUM_SLICES': '2', 'MEGASCALE_SLICE_ID': '1',
      'MEGASCALE_COORDINATOR_ADDRESS': 'mc'}, {},
     ('multi_controller', 'mc:8476', 8, 7)),
    # A single TPU VM is a local run.
    ({'TPU_WORKER_HOSTNAMES': 'h0', 'TPU_WORKER_ID': '0'}, {},
     ('local', None, 1, 0)),
    # Explicit flags win over the environment.
    ({**CPU_POD, 'JOB_INDEX': '0', 'JOB_COMPLETION_INDEX': '0'},
     dict(coordinator_address='me:5', process_count=2, process_id=1),
     ('multi_controller', 'me:5', 2, 1)),
])
def test_detect(env, flags, expected):
  d = backend.detect(env, **flags)
  assert (d.backend, d.coordinator_address, d.process_count,
          d.process_id) == expected
  assert d.reason


@pytest.mark.parametrize('env, flags, message', [
    (CPU_POD, {}, 'JOB_INDEX is missing'),
    ({**CPU_POD, 'JOB_INDEX': 'x', 'JOB_COMPLETION_INDEX': '0'}, {},
     'not an integer'),
    ({**CPU_POD, 'JOB_INDEX': '2', 'JOB_COMPLETION_INDEX': '0'}, {},
     'outside JAX_PROCESS_COUNT'),
    ({}, dict(coordinator_address='me:5', process_count=2, process_id=2),
     '--process_id'),
])
def test_detect_rejects_inconsistent_environments(env, flags, message):
  with pytest.raises(UsageError, match=message):
    backend.detect(env, **flags)


@pytest.fixture
def fake_pci(tmp_path, monkeypatch):
  """JAX's own PCI scan, run over a fake /sys/bus/pci/devices."""
  from jax._src import hardware_utils  # pylint: disable=g-import-not-at-top
  devices = tmp_path / 'devices'
  devices.mkdir()
  real_glob = hardware_utils.glob.glob
  monkeypatch.setattr(hardware_utils.glob, 'glob', lambda pattern: real_glob(
      pattern.replace('/sys/bus/pci/devices', str(devices))))

  def add(name, vendor, device):
    (devices / name).mkdir()
    (devices / name / 'vendor').write_text(vendor + '\n')
    (devices / name / 'device').write_text(device + '\n')

  return add


def test_a_host_without_tpu_chips_has_no_accelerator(fake_pci):
  fake_pci('0000:00:03.0', '0x8086', '0x0027')  # an Intel device
  fake_pci('0000:00:04.0', '0x1ae0', '0x0001')  # Google, but not a TPU
  assert not backend.accelerator_present()


def test_a_tpu_vm_has_an_accelerator(fake_pci):
  fake_pci('0000:00:04.0', '0x1ae0', '0x0063')  # a v5e chip
  assert backend.accelerator_present()


def test_cpu_runs_log_no_libtpu_noise(tmp_path):
  """libtpu is installed (test extra): with JAX_PLATFORMS unset, a CPU-only
  host runs on CPU without libtpu's initialisation errors."""
  env = helpers.env()
  del env['JAX_PLATFORMS']
  result = subprocess.run(
      [sys.executable, '-m', 'tunix_pw.main',
       '--config=tunix_pw/configs/smoke.py:collocated', '--config.steps=1',
       f'--workdir={tmp_path}'], cwd=helpers.ROOT, env=env,
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr
  assert '8 cpu devices' in result.stdout + result.stderr
  for noise in ('TPU_WORKER_HOSTNAMES', 'libtpu', 'TPU accelerator type'):
    assert noise not in result.stderr


def test_every_compiled_program_is_cached(tmp_path):
  """A program that compiles in well under JAX's 1 s threshold lands in the
  cache too (a fresh process: the suite's own cache setup aside)."""
  code = ('import sys, jax; from tunix_pw.runtime import backend; '
          'backend.cache_compiled_programs(sys.argv[1]); '
          'jax.jit(lambda x: x + 1)(1.0).block_until_ready()')
  subprocess.run([sys.executable, '-c', code, str(tmp_path)], check=True,
                 cwd=helpers.ROOT, env=helpers.env())
  assert [n for n in os.listdir(tmp_path) if 'jit__lambda' in n]
