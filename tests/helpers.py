"""Running tunix_pw entry points as subprocesses, the way users do."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests import forkserver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# libtpu describes TPU topologies on a CPU host (the test extra installs it;
# the current-JAX check in .ci/run does not).
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec('libtpu') is None,
                                  reason='TPU topologies need libtpu')


# GRPO's runlocal with every role on all 8 devices.
GRPO_COLLOCATED = ['--config.meshes.layout=collocated',
                   '--config.meshes.actor.axes=fsdp=8',
                   '--config.meshes.actor.devices=all',
                   '--config.meshes.reference.axes=fsdp=8',
                   '--config.meshes.rollout.axes=fsdp=1,tp=8',
                   '--config.meshes.rollout.devices=all']


# conftest's `trained_sft`: SFT on 2-digit additions on one device until an
# evaluation (every 100 steps) finds it 90% right.
TRAINED_SFT = ('--config=tunix_pw/configs/sft.py:runlocal',
               '--config.runtime.host_device_count=1',
               '--config.meshes.actor.axes=fsdp=1', '--config.steps=1000',
               '--config.log_every=100', '--config.checkpoint.every=0',
               '--config.eval_every=100', '--config.stop_at_accuracy=0.9')


def env(**extra: str) -> dict[str, str]:
  """The test environment for a child process: CPU JAX, repo importable."""
  out = {k: v for k, v in os.environ.items()
         if not k.startswith(('JAX_COORDINATOR', 'JAX_PROCESS', 'JOB_',
                              'PROCESSES_IN_JOB', 'TPU_WORKER', 'MEGASCALE'))}
  out.update(JAX_PLATFORMS='cpu', PYTHONPATH=ROOT, PYTHONUNBUFFERED='1')
  out.update(extra)
  return out


FORK_SERVER = forkserver.ForkServer(ROOT, env)


# main, SIGKILLed (no cleanup) right after the end-of-step duties of step
# $KILL_AT_STEP, once that step's checkpoint is written.
KILLED_AT_STEP = """
import os, signal, sys
from tunix_pw import main
from tunix_pw.train import loop

end_of_step = loop.Session.end_of_step

def end_of_step_then_kill(session, done, *args, **kwargs):
  end_of_step(session, done, *args, **kwargs)
  if done == int(os.environ['KILL_AT_STEP']):
    session.wait()
    os.kill(os.getpid(), signal.SIGKILL)

loop.Session.end_of_step = end_of_step_then_kill
sys.argv = ['main'] + sys.argv[1:]
main.run()
"""


# What a process reads as it imports tunix_pw.main: a run whose environment
# differs from the fork server's here starts a new interpreter.
READ_AT_IMPORT = re.compile(r'PYTHON|LD_|JAX_|XLA_|TF_|TPU_|LIBTPU|TUNIX_PW_')


def run_main(*args: str, timeout: float = 300, kill_at_step: int = 0,
             **extra_env: str) -> subprocess.CompletedProcess:
  """main in a fresh process (forked from the fork server where the
  environment allows); with `kill_at_step`, SIGKILLed after it."""
  code = ''
  if kill_at_step:
    code = KILLED_AT_STEP
    extra_env['KILL_AT_STEP'] = str(kill_at_step)
  run_env = env(**extra_env)
  if all(run_env.get(k) == FORK_SERVER.env.get(k)
         for k in run_env.keys() | FORK_SERVER.env.keys()
         if READ_AT_IMPORT.match(k)):
    with tempfile.TemporaryDirectory() as tmpdir:
      return FORK_SERVER.run(list(args), run_env, tmpdir, timeout, code)
  command = ['-c', code] if code else ['-m', 'tunix_pw.main']
  return subprocess.run([sys.executable, *command, *args], cwd=ROOT,
                        env=run_env, capture_output=True, text=True,
                        timeout=timeout)


def launch_local(num_processes: int, *args: str, timeout: float = 300,
                 **extra_env: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, os.path.join(ROOT, 'launch', 'local.py'),
       f'--num_processes={num_processes}', '--', *args],
      cwd=ROOT, env=env(**extra_env), capture_output=True, text=True,
      timeout=timeout)


def fault(**spec: Any) -> dict[str, str]:
  """The environment that has benchmarks/inject strike a job's processes
  (its docstring: phase, call, signal, process, ...)."""
  return dict(PYTHONPATH=f'{ROOT}/benchmarks/inject:{ROOT}',
              TUNIX_PW_FAULT=json.dumps(spec))


def host_state(workdir, step: int) -> list[np.ndarray]:
  """A checkpoint's state as numpy arrays, whatever devices wrote it."""
  path = os.path.join(workdir, 'checkpoints', str(step), 'state')
  checkpointer = ocp.PyTreeCheckpointer()
  structure = checkpointer.metadata(path).item_metadata.tree
  args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                      structure)
  return jax.tree.leaves(checkpointer.restore(path, restore_args=args))


def error_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith('error: ')]


def wait_for(path, proc: subprocess.Popen, timeout: float = 120) -> None:
  """Until `path` exists; fails if `proc` exits first or time runs out."""
  deadline = time.monotonic() + timeout
  while not os.path.exists(path):
    assert proc.poll() is None, f'exited with {proc.returncode} before {path}'
    assert time.monotonic() < deadline, f'no {path} after {timeout} s'
    time.sleep(0.05)


# An agentic pipeline's RL stage kept small: 2 steps of 2 prompts x 4
# episodes, 8 held-out episodes.
AGENTIC_SMALL = ['--config.agentic.steps=2',
                 '--config.agentic.eval_examples=8',
                 '--config.agentic.rl.prompts_per_step=2',
                 '--config.agentic.rl.num_generations=4',
                 '--config.agentic.rl.mini_batch_size=8',
                 '--config.agentic.rl.micro_batch_size=4',
                 '--config.agentic.rl.logps_micro_batch_size=8']
