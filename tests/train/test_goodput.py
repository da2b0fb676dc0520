"""Goodput in every training job's workdir (goodput.json, TensorBoard) and
its one-line summary; a profiler trace of chosen steps."""

import glob
import gzip
import json
import signal
import threading
import time

import jax
import jax.numpy as jnp
import pytest

from tests import helpers
from tunix_pw.train import goodput

SFT = ['--config=tunix_pw/configs/sft.py:runlocal', '--config.steps=5',
       '--config.log_every=1', '--config.checkpoint.every=2',
       '--config.eval_examples=0', '--config.runtime.host_device_count=1',
       '--config.meshes.actor.axes=fsdp=1']


def test_goodput_counts_a_restart_and_the_profile_holds_the_steps(tmp_path):
  args = [*SFT, '--config.runtime.profile_steps=3:5', f'--workdir={tmp_path}']
  killed = helpers.run_main(*args, kill_at_step=3)  # step 3 is redone
  assert killed.returncode == -signal.SIGKILL
  with open(tmp_path / 'metrics.jsonl') as f:
    [redone] = [r['step_seconds'] for r in map(json.loads, f)
                if r['step'] == 3]
  began = time.time()
  resumed = helpers.run_main(*args)
  ran_s = time.time() - began
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  [line] = [l for l in resumed.stdout.splitlines() if 'goodput' in l]
  assert line.startswith('sft: goodput ') and 'restarts' in line
  record = json.loads((tmp_path / 'goodput.json').read_text())
  # The resumed run's first step (4) ended after the process began its
  # imports and the compilation, before the process ended.
  first = record['time/first_step_s']
  assert record['goodput/compilation_s'] < first < ran_s
  assert f'first step done {first:.1f} s after the start' in line
  assert record['step'] == 5 and 0 < record['goodput'] < 1
  lost = [v for k, v in record.items() if k.startswith('goodput/')
          and k not in ('goodput/wall_s', 'goodput/productive_s')]
  assert min(lost) >= 0
  assert sum(lost) + record['goodput/productive_s'] == pytest.approx(
      record['goodput/wall_s'] + record['goodput/restarts_s'])
  # The redone step 3, at the killed run's logged step time.
  assert record['goodput/restarts_s'] == pytest.approx(redone)
  assert record['goodput/compilation_s'] > 0
  assert record['goodput/checkpoints_s'] > 0
  assert record['goodput/productive_s'] > 0
  [trace] = glob.glob(str(tmp_path / 'profile' / 'plugins' / 'profile' /
                          '*' / 'perfetto_trace.json.gz'))
  with gzip.open(trace) as f:
    events = json.load(f)
  names = {e.get('name', '') for e in (
      events['traceEvents'] if isinstance(events, dict) else events)}
  assert any('train_step' in n or 'jit' in n for n in names), sorted(names)[:40]


@pytest.mark.parametrize('spec', ['0', '4:2', '3:9', 'x'])
def test_a_bad_profile_window_exits_2(tmp_path, spec):
  result = helpers.run_main(*SFT, f'--config.runtime.profile_steps={spec}',
                            '--check_only', f'--workdir={tmp_path}')
  assert result.returncode == 2
  [line] = helpers.error_lines(result.stderr)
  assert f"profile_steps='{spec}' must be a step N" in line


def test_compiles_in_threads_at_once_count_their_wall_time_once():
  """Two threads compiling at once (a rollout's beside the trainer's)
  inside the training loop: compilation is their overlap's wall time,
  never more than the loop, and productive time is never negative."""
  def compile_some(seed):
    for n in range(6):
      f = jax.jit(lambda x, n=n, seed=seed: jnp.cumsum(
          jnp.sin(x * (seed + 1)) @ x.T + n, axis=seed % 2))
      f.lower(jnp.ones((64 + n, 64 + n))).compile()

  run = goodput.Goodput()
  with run.training():
    threads = [threading.Thread(target=compile_some, args=(i,))
               for i in range(2)]
    began = time.perf_counter()
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    wall = time.perf_counter() - began
  values, _ = run.summary('test')
  assert 0 < values['goodput/compilation_s'] <= wall + 0.01, (values, wall)
  assert values['goodput/productive_s'] >= 0, values
