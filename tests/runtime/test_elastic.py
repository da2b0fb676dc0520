"""Elastic slices on Pathways through main: a slice lost mid-step -> the
manager waits for a healthy slice -> the meshes are rebuilt on its devices
-> the job restores its last checkpoint and finishes, in one process.
What cannot run here is faked at the lowest call: Pathways' initialisation
(JAX stays on the CPU), the devices' slice of each (two slices of four CPU
devices) and pathwaysutils' health check of each slice; our wrapper and
pathwaysutils' elastic manager run as they are."""

import subprocess
import sys

import numpy as np
import pytest

from tests import helpers
from tunix_pw.train import metrics

LOSE_A_SLICE = """
import runpy, sys, threading
import jax
import pathwaysutils
from pathwaysutils.elastic import elastic
from tunix_pw.train import loop

pathwaysutils.initialize = lambda: jax.config.update('jax_platforms', 'cpu')
elastic.get_slice_to_devices = lambda devices: {
    0: list(devices[:4]), 1: list(devices[4:])}
lost, waits, lock = threading.Event(), [1], threading.Lock()

def healthy(slice_to_devices, checker=None):
  # After the loss, slice 1 stays down, and the first check of slice 0
  # fails too (the job waits one poll).
  with lock:
    up = {i for i in slice_to_devices if not (lost.is_set() and i == 1)}
    if lost.is_set() and 0 in up and waits[0]:
      waits[0] -= 1
      up.discard(0)
  print(f'health check of slices {sorted(slice_to_devices)}: {sorted(up)} '
        'healthy', flush=True)
  return frozenset(up)

elastic.get_active_slice_indices = healthy
add = loop.Tracker.add

def add_or_lose_a_slice(self, done, *args, **kwargs):
  if done == 3 and not lost.is_set():
    lost.set()  # what a step on a lost slice raises on Pathways
    raise jax.errors.JaxRuntimeError('DATA_LOSS: slice 1 is gone (test)')
  return add(self, done, *args, **kwargs)

loop.Tracker.add = add_or_lose_a_slice
sys.argv = ['main'] + sys.argv[1:]
runpy.run_module('tunix_pw.main', run_name='__main__')
"""

ARGS = ['--config=tunix_pw/configs/sft.py:runlocal',
        '--config.meshes.actor.axes=fsdp=-1', '--config.steps=6',
        '--config.log_every=1', '--config.checkpoint.every=2',
        '--config.eval_examples=0']


def losses(workdir):
  return [m['loss'] for m in metrics.read(str(workdir)) if 'loss' in m]


def test_a_lost_slice_waits_rebuilds_on_the_rest_and_resumes(tmp_path):
  result = subprocess.run(
      [sys.executable, '-c', LOSE_A_SLICE, *ARGS,
       '--config.runtime.elastic.min_slices=1',
       '--config.runtime.elastic.poll_s=0.2', f'--workdir={tmp_path / "e"}'],
      cwd=helpers.ROOT, env=helpers.env(JAX_PLATFORMS='proxy'),
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  assert 'runtime pathways' in out and 'on 8 devices' in out, out
  assert 'health check of slices [0, 1]: [] healthy' in out  # it waited
  assert 'elastic: attempt 2 on slices [0] (4 of 8 devices)' in out, out
  assert "meshes: actor {'fsdp': 4} on 4 devices" in out, out
  assert ('sft: resumed from step 2 (written on 8 devices by 1 process; '
          'now 4 and 1)') in out, out
  assert 'a slice was lost during attempt 1' in result.stderr
  steps = [m['step'] for m in metrics.read(str(tmp_path / 'e'))
           if 'loss' in m]
  assert steps == [1, 2, 3, 4, 5, 6]
  # Steps 3-6 ran on 4 devices from step 2's state: as a run on 4 devices
  # from the start would have (the topology moves within rtol 1e-5,
  # tests/jobs/test_topology.py).
  straight = helpers.run_main(*ARGS, '--config.runtime.host_device_count=4',
                              f'--workdir={tmp_path / "four"}')
  assert straight.returncode == 0, straight.stderr[-3000:]
  np.testing.assert_allclose(losses(tmp_path / 'e'),
                             losses(tmp_path / 'four'), rtol=1e-5)


def test_without_elastic_a_lost_slice_ends_the_job(tmp_path):
  result = subprocess.run(
      [sys.executable, '-c', LOSE_A_SLICE, *ARGS, f'--workdir={tmp_path}'],
      cwd=helpers.ROOT, env=helpers.env(JAX_PLATFORMS='proxy'),
      capture_output=True, text=True, timeout=300)
  assert result.returncode == 1, result.stderr[-3000:]
  assert 'DATA_LOSS: slice 1 is gone' in result.stderr


@pytest.mark.parametrize('override, message', [
    ('min_slices=-1', 'min_slices=-1 must be an integer of at least 0'),
    ('poll_s=0', 'poll_s=0.0 must be a number of seconds from 0.001 on'),
    ('timeout_s=inf', 'timeout_s=inf must be a number of seconds from 0 on'),
    ('max_attempts=0', 'max_attempts=0 must be an integer of at least 1'),
])
def test_bad_elastic_settings_are_named(tmp_path, override, message):
  result = helpers.run_main(*ARGS, f'--config.runtime.elastic.{override}',
                            '--check_only', f'--workdir={tmp_path}')
  assert result.returncode == 2, result.stderr[-2000:]
  [line] = helpers.error_lines(result.stderr)
  assert f'--config.runtime.elastic.{message}' in line, line
