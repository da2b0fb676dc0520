"""Real multi-controller runs on localhost: by hand with only the XPK CPU
variables, and through launch/local.py; failures never hang the launcher."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import psutil

from launch import local
from tests import helpers
from tunix_pw.train import metrics

SMOKE = ['--config=tunix_pw/configs/smoke.py:collocated', '--config.steps=4']


def losses(workdir):
  summary = json.loads((workdir / 'smoke_summary.json').read_text())
  return summary, np.array(summary['losses'])


def test_two_processes_by_hand_match_one_process(tmp_path):
  single = helpers.run_main(*SMOKE, f'--workdir={tmp_path / "one"}')
  assert single.returncode == 0, single.stderr
  _, expected = losses(tmp_path / 'one')

  port = local.free_port()
  procs = [
      subprocess.Popen(
          [sys.executable, '-m', 'tunix_pw.main', *SMOKE,
           f'--workdir={tmp_path / "two"}'],
          cwd=helpers.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
          text=True, env=helpers.env(**local.process_env(i, 2, port)))
      for i in range(2)]
  outputs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outputs
  summary, got = losses(tmp_path / 'two')
  assert summary['backend'] == 'multi_controller'
  assert summary['processes'] == 2 and summary['devices'] == 8
  np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)


def test_launcher_matches_one_process(tmp_path):
  single = helpers.run_main(*SMOKE, f'--workdir={tmp_path / "one"}')
  assert single.returncode == 0, single.stderr
  result = helpers.launch_local(2, *SMOKE, f'--workdir={tmp_path / "two"}')
  assert result.returncode == 0, result.stdout + result.stderr
  assert '[p0] smoke: multi_controller backend, 2 process(es)' in result.stdout
  np.testing.assert_allclose(losses(tmp_path / 'two')[1],
                             losses(tmp_path / 'one')[1], atol=1e-6, rtol=0)


def test_killing_one_process_fails_the_launcher_quickly(tmp_path):
  launcher = subprocess.Popen(
      [sys.executable, os.path.join(helpers.ROOT, 'launch', 'local.py'),
       '--num_processes=2', '--', *SMOKE[:1], '--config.steps=100000000',
       f'--workdir={tmp_path}'],
      cwd=helpers.ROOT, env=helpers.env(), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)
  # The snapshot is written once both processes are up and meshes are built.
  helpers.wait_for(tmp_path / 'config.json', launcher)
  children = psutil.Process(launcher.pid).children()
  assert len(children) == 2
  children[1].send_signal(signal.SIGKILL)
  killed_at = time.monotonic()
  output, _ = launcher.communicate(timeout=60)
  assert time.monotonic() - killed_at < 60
  assert launcher.returncode == 128 + signal.SIGKILL, output
  assert 'process 1 exited with 137; stopping the others' in output


def test_launcher_environment_is_what_the_backend_reads():
  from tunix_pw.runtime import backend  # pylint: disable=g-import-not-at-top
  for i in range(3):
    detection = backend.detect(local.process_env(i, 3, 999))
    assert (detection.backend, detection.process_id,
            detection.process_count) == ('multi_controller', i, 3)
    assert detection.coordinator_address == 'localhost:999'


def test_a_stopped_peer_ends_the_job_and_the_coordinator_is_local(tmp_path):
  """SIGSTOP one of two processes mid-run: the others stop waiting after
  --config.runtime.peer_timeout_s and the launcher exits non-zero; the
  coordinator listens on the loopback interface only."""
  launcher = subprocess.Popen(
      [sys.executable, 'launch/local.py', '--num_processes=2', '--',
       '--config=tunix_pw/configs/smoke.py:collocated',
       '--config.steps=100000000', '--config.runtime.peer_timeout_s=10',
       f'--workdir={tmp_path}'], cwd=helpers.ROOT, env=helpers.env(),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  helpers.wait_for(tmp_path / 'config.json', launcher)
  children = {p.environ()['JOB_COMPLETION_INDEX']: p
              for p in psutil.Process(launcher.pid).children()}
  listening = [c.laddr.ip for c in children['0'].net_connections('tcp')
               if c.status == psutil.CONN_LISTEN]
  assert listening and all(ip in ('127.0.0.1', '::ffff:127.0.0.1', '::1')
                           for ip in listening), listening
  children['1'].send_signal(signal.SIGSTOP)
  start = time.monotonic()
  output, _ = launcher.communicate(timeout=120)
  assert time.monotonic() - start < 60
  assert launcher.returncode not in (0, 42), output[-3000:]
  assert 'stopped sending heartbeats' in output


def test_a_dead_process_is_restarted_on_the_survivors(tmp_path):
  """--restarts=1: process 1 of 2 SIGKILLed in step 6 -> the launcher
  starts the job again on the one survivor, with its 4 devices -> it
  resumes from the last complete checkpoint on the smaller topology and
  finishes."""
  result = subprocess.run(
      [sys.executable, 'launch/local.py', '--num_processes=2', '--restarts=1',
       '--', '--config=tunix_pw/configs/sft.py:runlocal',
       '--config.runtime.host_device_count=8',
       '--config.meshes.actor.axes=fsdp=-1', '--config.steps=8',
       '--config.log_every=1', '--config.checkpoint.every=2',
       '--config.eval_examples=0', f'--workdir={tmp_path}'],
      cwd=helpers.ROOT, env=helpers.env(**helpers.fault(
          phase='step', call=6, signal='SIGKILL', process=1)),
      capture_output=True, text=True, timeout=300)
  out = result.stdout
  assert result.returncode == 0, out[-3000:]
  assert 'process 1 exited with 137; stopping the others' in out
  assert '[launch] restarting on the 1 surviving process(es)' in out
  assert 'runtime.host_device_count 8 -> 4' in out, out[-3000:]
  resumed = re.search(r'sft: resumed from step (\d+) \(written on 8 devices '
                      r'by 2 processes; now 4 and 1\)', out)
  assert resumed and int(resumed[1]) in (2, 4), out[-3000:]
  steps = [m['step'] for m in metrics.read(str(tmp_path)) if 'loss' in m]
  assert steps == list(range(1, 9))
