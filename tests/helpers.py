"""Running tunix_pw entry points as subprocesses, the way users do."""

from __future__ import annotations

import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env(**extra: str) -> dict[str, str]:
  """The test environment for a child process: CPU JAX, repo importable."""
  out = {k: v for k, v in os.environ.items()
         if not k.startswith(('JAX_COORDINATOR', 'JAX_PROCESS', 'JOB_',
                              'PROCESSES_IN_JOB', 'TPU_WORKER', 'MEGASCALE'))}
  out.update(JAX_PLATFORMS='cpu', PYTHONPATH=ROOT, PYTHONUNBUFFERED='1')
  out.update(extra)
  return out


def run_main(*args: str, timeout: float = 300,
             **extra_env: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', 'tunix_pw.main', *args],
                        cwd=ROOT, env=env(**extra_env), capture_output=True,
                        text=True, timeout=timeout)


def launch_local(num_processes: int, *args: str,
                 timeout: float = 300) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, os.path.join(ROOT, 'launch', 'local.py'),
       f'--num_processes={num_processes}', '--', *args],
      cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)


def error_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith('error: ')]


def wait_for(path, proc: subprocess.Popen, timeout: float = 120) -> None:
  """Until `path` exists; fails if `proc` exits first or time runs out."""
  deadline = time.monotonic() + timeout
  while not os.path.exists(path):
    assert proc.poll() is None, f'exited with {proc.returncode} before {path}'
    assert time.monotonic() < deadline, f'no {path} after {timeout} s'
    time.sleep(0.05)
