"""Agreed preemption: SIGTERM -> same stop on every process -> checkpoint
hook once per process -> exit 42, for one process and for two."""

import json
import signal
import subprocess
import sys
import time

import psutil

from tests import helpers

LONG_SMOKE = ['--config=tunix_pw/configs/smoke.py:collocated',
              '--config.steps=1000000']


def wait_until_running(workdir, proc):
  """The snapshot is written once the runtime and meshes are up."""
  helpers.wait_for(workdir / 'config.json', proc)
  time.sleep(1.0)  # into the step loop


def checkpoints(workdir, process):
  lines = (workdir / f'smoke_checkpoint_p{process}').read_text().splitlines()
  return [json.loads(line) for line in lines]


def test_one_process_checkpoints_then_exits_42(tmp_path):
  proc = subprocess.Popen(
      [sys.executable, '-m', 'tunix_pw.main', *LONG_SMOKE,
       f'--workdir={tmp_path}'], cwd=helpers.ROOT, env=helpers.env(),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  wait_until_running(tmp_path, proc)
  proc.send_signal(signal.SIGTERM)
  output, _ = proc.communicate(timeout=60)
  assert proc.returncode == 42, output
  [saved] = checkpoints(tmp_path, 0)
  assert 1 <= saved['step'] < 1000000


def test_sigterm_to_process_0_stops_both_at_the_same_step(tmp_path):
  launcher = subprocess.Popen(
      [sys.executable, 'launch/local.py', '--num_processes=2', '--',
       *LONG_SMOKE, f'--workdir={tmp_path}'], cwd=helpers.ROOT,
      env=helpers.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True)
  wait_until_running(tmp_path, launcher)
  [process_0] = [p for p in psutil.Process(launcher.pid).children()
                 if p.environ().get('JOB_COMPLETION_INDEX') == '0']
  process_0.send_signal(signal.SIGTERM)  # only process 0 is told
  output, _ = launcher.communicate(timeout=120)
  assert launcher.returncode == 42, output
  assert '[launch] exit codes: [42, 42]' in output
  [saved_0], [saved_1] = checkpoints(tmp_path, 0), checkpoints(tmp_path, 1)
  assert saved_0['step'] == saved_1['step'] >= 1
  assert saved_0['checksum'] == saved_1['checksum']
