"""SFT, DPO, ORPO and KTO through main: pulses on 8 devices (fsdp=4, tp=2),
learning, metrics files, bit-identical resume after SIGKILL (at random
moments: tests/test_faults.py and benchmarks/faults.py), torn
checkpoints, preemption."""

import os
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests import helpers
from tunix_pw.train import metrics

SFT = '--config=tunix_pw/configs/sft.py:runlocal'
DPO = '--config=tunix_pw/configs/dpo.py:runlocal'
ONE_DEVICE = ['--config.runtime.host_device_count=1',
              '--config.meshes.actor.axes=fsdp=1']


@pytest.mark.parametrize('config, extra', [
    (SFT, ['--config.eval_examples=20']),
    (SFT, ['--config.lora.rank=4', '--config.eval_examples=20']),
    (SFT, ['--config.lora.rank=4', '--config.lora.quantize=int8',
           '--config.data.packing=True', '--config.eval_examples=0']),
    (DPO, []),
    (DPO, ['--config.dpo.algorithm=orpo']),
    (DPO, ['--config.lora.rank=4']),  # reference: the shared base
    # KTO with LoRA: the same reference path as DPO's (its plan is tested).
    # On 32 pairs (one batch of 64 examples, every step), from the first.
    (DPO, ['--config.dpo.algorithm=kto', '--config.data.train_examples=32',
           '--config.optimizer.warmup_steps=0']),
])
def test_two_step_pulse_on_fsdp4_tp2(tmp_path, config, extra):
  result = helpers.run_main(config, '--config.steps=2', '--config.log_every=1',
                            *extra, f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  assert "actor {'fsdp': 4, 'tp': 2} on 8 devices" in result.stdout
  logged = metrics.read(str(tmp_path))
  steps = [m for m in logged if 'loss' in m]
  assert [m['step'] for m in steps] == [1, 2]
  assert all(np.isfinite(m['loss']) for m in steps)
  if '--config.dpo.algorithm=kto' in extra:
    # The policy starts as its reference: every example at the reference
    # point, a loss of 1/2; one step on the batch lowers it (measured:
    # 0.434, 88% of the examples on their label's side).
    assert steps[0]['loss'] == pytest.approx(0.5, abs=1e-3)
    assert steps[1]['loss'] < steps[0]['loss'] - 0.01, steps
    assert steps[1]['preferred'] > 0.5, steps
  assert os.listdir(tmp_path / 'tensorboard')  # event files
  assert '2' in os.listdir(tmp_path / 'checkpoints')


def test_sft_learns_two_digit_addition(trained_sft):
  """>= 80% greedy exact match on 500 held-out problems (fixed seed) within
  1,000 steps; the run (conftest's `trained_sft`) stops at the first
  evaluation at 90% or above."""
  result, workdir = trained_sft
  assert result.returncode == 0, result.stderr[-3000:]
  evals = [m for m in metrics.read(str(workdir)) if 'eval/accuracy' in m]
  final = evals[-1]
  assert final['eval/total'] == 500
  assert final['eval/accuracy'] >= 0.8, final
  assert 'reached --config.stop_at_accuracy=0.9: stopping' in result.stdout
  assert evals[-2]['eval/accuracy'] < 0.9  # stopped at the first one


def test_the_same_run_again_ends_where_it_stopped(trained_sft, tmp_path):
  """A run stopped at --config.stop_at_accuracy has ended: the same
  command again resumes there, evaluates and stops, training nothing (it
  had trained on to the next evaluation: the demo, run twice, reported an
  SFT stage other than the one its GRPO stage started from)."""
  result, workdir = trained_sft
  assert result.returncode == 0, result.stderr[-3000:]
  rerun = tmp_path / 'sft'
  shutil.copytree(workdir, rerun)
  evals = lambda: [m for m in metrics.read(str(rerun)) if 'eval/accuracy' in m]
  before = evals()
  result = helpers.run_main(*helpers.TRAINED_SFT, f'--workdir={rerun}',
                            timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'reached --config.stop_at_accuracy=0.9: stopping' in result.stdout
  after, stopped = evals(), before[-1]['step']
  assert len(after) == len(before) + 1  # one evaluation, where it stopped
  assert after[-1]['step'] == stopped
  assert after[-1]['eval/accuracy'] == before[-1]['eval/accuracy']
  assert max(m['step'] for m in metrics.read(str(rerun))) == stopped
  assert [d for d in os.listdir(rerun / 'checkpoints') if d.isdigit()] == [
      str(stopped)]


def final_state(workdir, step):
  return jax.tree.leaves(ocp.StandardCheckpointer().restore(
      str(workdir / 'checkpoints' / str(step) / 'state')))


RESUME_ARGS = [SFT, *ONE_DEVICE, '--config.steps=30', '--config.log_every=5',
               '--config.checkpoint.every=5', '--config.eval_examples=0']


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
  workdir = tmp_path_factory.mktemp('straight')
  result = helpers.run_main(*RESUME_ARGS, f'--workdir={workdir}')
  assert result.returncode == 0, result.stderr[-2000:]
  return final_state(workdir, 30)


def test_resume_after_sigkill_at_step_k_is_bit_identical(tmp_path,
                                                         uninterrupted):
  killed = helpers.run_main(*RESUME_ARGS, f'--workdir={tmp_path}',
                            kill_at_step=12)
  assert killed.returncode == -signal.SIGKILL
  resumed = helpers.run_main(*RESUME_ARGS, f'--workdir={tmp_path}')
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert 'resumed from step 10' in resumed.stdout
  for a, b in zip(final_state(tmp_path, 30), uninterrupted):
    np.testing.assert_array_equal(a, b)


def test_a_torn_checkpoint_is_skipped_for_the_previous_one(tmp_path):
  args = [SFT, *ONE_DEVICE, '--config.log_every=5',
          '--config.checkpoint.every=5', '--config.eval_examples=0']
  first = helpers.run_main(*args, '--config.steps=10', f'--workdir={tmp_path}')
  assert first.returncode == 0, first.stderr[-2000:]
  torn = tmp_path / 'checkpoints' / '10' / 'state'
  for root, _, files in os.walk(torn):
    for name in files:
      if name != '_CHECKPOINT_METADATA':
        open(os.path.join(root, name), 'w').close()  # emptied: unreadable
  again = helpers.run_main(*args, '--config.steps=12', '-v=0',
                           f'--workdir={tmp_path}')
  assert again.returncode == 0, again.stderr[-2000:]
  assert 'resumed from step 5' in again.stdout
  assert 'newer checkpoints are unreadable (step 10' in again.stderr
  # The run saved step 10 again over the torn copy: it reads now.
  assert len(final_state(tmp_path, 10)) == len(final_state(tmp_path, 12))


def test_sigterm_checkpoints_then_exits_42_and_resumes(tmp_path):
  args = [SFT, *ONE_DEVICE, '--config.steps=100000', '--config.log_every=5',
          '--config.checkpoint.every=0', '--config.eval_examples=0']
  proc = subprocess.Popen(
      [sys.executable, '-m', 'tunix_pw.main', *args, f'--workdir={tmp_path}'],
      cwd=helpers.ROOT, env=helpers.env(), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)
  helpers.wait_for(tmp_path / 'metrics.jsonl', proc)
  proc.send_signal(signal.SIGTERM)
  output, _ = proc.communicate(timeout=120)
  assert proc.returncode == 42, output[-2000:]
  saved = [int(s) for s in os.listdir(tmp_path / 'checkpoints')
           if s.isdigit()]
  assert len(saved) == 1 and saved[0] >= 5
  again = helpers.run_main(*args[:1], *ONE_DEVICE,
                           f'--config.steps={saved[0] + 2}',
                           '--config.eval_examples=0', f'--workdir={tmp_path}')
  assert again.returncode == 0 and f'resumed from step {saved[0]}' in \
      again.stdout


@pytest.mark.parametrize('algorithm, rising', [('dpo', 'margin'),
                                               ('orpo', 'margin'),
                                               ('kto', 'preferred')])
def test_a_few_steps_learn_a_tiny_preference_set(tmp_path, algorithm, rising):
  """DPO and ORPO widen the margin, KTO puts every example on its label's
  side of the reference point; the held-out pairs are then evaluated."""
  result = helpers.run_main(DPO, *ONE_DEVICE,
                            '--config.meshes.reference.axes=fsdp=1',
                            f'--config.dpo.algorithm={algorithm}',
                            '--config.data.arithmetic.train_size=32',
                            '--config.data.arithmetic.test_size=8',
                            '--config.eval_batch_size=8',
                            '--config.steps=20', '--config.log_every=5',
                            f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr[-2000:]
  logged = metrics.read(str(tmp_path))
  trend = [m[rising] for m in logged if 'loss' in m]
  assert trend == sorted(trend) and trend[-1] > trend[0]
  if rising == 'margin':
    assert trend[-1] > trend[0] + 1.0
  assert [m['preferred'] for m in logged if 'loss' in m][-1] == 1.0
  assert logged[-1]['eval/pairs'] == 8
  assert 'held-out pairwise accuracy' in result.stdout


def test_too_few_held_out_pairs_for_one_batch_exit_2_before_training(
    tmp_path):
  result = helpers.run_main(DPO, *ONE_DEVICE,
                            '--config.meshes.reference.axes=fsdp=1',
                            '--config.data.arithmetic.test_size=8',
                            f'--workdir={tmp_path}')
  assert result.returncode == 2
  [line] = helpers.error_lines(result.stderr)
  assert 'the test split of arithmetic has 8 examples, fewer than one ' \
      'evaluation batch (--config.eval_batch_size=100)' in line
  assert not (tmp_path / 'checkpoints').exists()


@pytest.mark.parametrize('flags, says', [
    (['--config.dpo.algorithm=kto', '--config.data.name=gsm8k',
      '--config.data.manual_dir=/nonexistent'],
     "use 'preferences' (or 'arithmetic' for a built-in set), or 'unpaired'"),
    (['--config.data.name=unpaired', '--config.data.manual_dir=/nonexistent'],
     "--config.data.name='unpaired' has no preference pairs"),
    (['--config.dpo.algorithm=kto', '--config.dpo.kto_lambda_undesirable=0'],
     'kto_lambda_undesirable must be positive'),
])
def test_preference_config_errors(tmp_path, flags, says):
  result = helpers.run_main(DPO, *flags, '--check_only',
                            f'--workdir={tmp_path}')
  assert result.returncode == 2
  [line] = helpers.error_lines(result.stderr)
  assert says in line


def test_two_controllers_resume_bit_identical(tmp_path):
  """Each process reads its own share of the data: a SIGTERM mid-run (exit
  42 on both) and a resume end where an uninterrupted run does, because
  every process's data position is checkpointed (only process 0's was, and
  process 1 resumed on process 0's)."""
  args = [SFT, '--config.steps=8', '--config.log_every=1',
          '--config.checkpoint.every=0', '--config.eval_examples=0',
          '--config.batch_size=16', '--config.data.max_length=10',
          '--config.data.overlong=drop']  # shares drop unlike amounts
  straight = helpers.launch_local(2, *args, f'--workdir={tmp_path / "a"}')
  assert straight.returncode == 0, straight.stdout[-3000:]
  launcher = subprocess.Popen(
      [sys.executable, 'launch/local.py', '--num_processes=2', '--', *args,
       f'--workdir={tmp_path / "b"}'], cwd=helpers.ROOT, env=helpers.env(),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  helpers.wait_for(tmp_path / 'b' / 'metrics.jsonl', launcher)
  launcher.send_signal(signal.SIGTERM)
  output, _ = launcher.communicate(timeout=120)
  assert launcher.returncode == 42, output[-3000:]
  [stopped] = os.listdir(tmp_path / 'b' / 'checkpoints')
  assert 0 < int(stopped) < 8
  resumed = helpers.launch_local(2, *args, f'--workdir={tmp_path / "b"}')
  assert resumed.returncode == 0, resumed.stdout[-3000:]
  for a, b in zip(helpers.host_state(tmp_path / 'a', 8),
                  helpers.host_state(tmp_path / 'b', 8)):
    np.testing.assert_array_equal(a, b)
