"""Bad input ends in one sentence and exit 2 (no traceback, no hang);
SIGTERM before the first step exits 42 at once; --check_only validates
without doing any work."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import helpers

SFT = '--config=tunix_pw/configs/sft.py:runlocal'
DPO = '--config=tunix_pw/configs/dpo.py:runlocal'
GRPO = '--config=tunix_pw/configs/grpo.py:runlocal'


def one_error(result) -> str:
  assert result.returncode == 2, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr
  [line] = helpers.error_lines(result.stderr)
  return line


@pytest.mark.parametrize('config, override', [
    (SFT, 'micro_batches'), (SFT, 'log_every'), (DPO, 'micro_batches'),
    (DPO, 'log_every'), (GRPO, 'log_every'), (GRPO, 'rl.micro_batch_size'),
    (GRPO, 'rl.logps_micro_batch_size'), (GRPO, 'rl.mini_batch_size'),
    (GRPO, 'rl.num_generations'),
])
def test_zero_sizes_and_cadences_are_named(tmp_path, config, override):
  result = helpers.run_main(config, f'--config.{override}=0', '--check_only',
                            f'--workdir={tmp_path / "w"}')
  assert f'--config.{override}=0 must be an integer of at least 1' in (
      one_error(result))
  assert not (tmp_path / 'w').exists()


def test_check_only_validates_both_phases_and_writes_nothing(tmp_path):
  ok = helpers.run_main(GRPO, '--check_only', f'--workdir={tmp_path / "w"}')
  assert ok.returncode == 0, ok.stderr[-3000:]
  assert 'check_only: the grpo config is valid on these devices.' in ok.stdout
  assert not (tmp_path / 'w').exists()
  # The second phase: the devices (16 asked of 8).
  bad = helpers.run_main(GRPO, '--check_only',
                         '--config.meshes.actor.axes=fsdp=16')
  assert 'actor' in one_error(bad)


@pytest.mark.parametrize('config, extra, filter_', [
    (SFT, ['--config.data.max_length=4', '--config.data.overlong=drop'],
     "examples longer than --config.data.max_length=4 tokens are dropped "
     "(--config.data.overlong='drop')"),
    (GRPO, ['--config.rl.max_prompt_length=3', '--config.eval_examples=0'],
     'prompts longer than --config.rl.max_prompt_length=3 tokens are '
     'dropped'),
])
def test_all_data_filtered_out_exits_2_naming_the_filter(tmp_path, config,
                                                         extra, filter_):
  start = time.monotonic()
  result = helpers.run_main(config, *extra, f'--workdir={tmp_path}',
                            timeout=120)
  assert time.monotonic() - start < 60
  line = one_error(result)
  assert 'examples of the train split of arithmetic in a row were dropped' in line
  assert filter_ in line


def test_sigterm_before_the_first_step_exits_42_at_once(tmp_path):
  proc = subprocess.Popen(
      [sys.executable, '-m', 'tunix_pw.main', SFT, f'--workdir={tmp_path}'],
      cwd=helpers.ROOT, env=helpers.env(), stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)
  line = proc.stdout.readline()  # the runtime has started: setup is next
  assert line.startswith('runtime local'), line
  proc.send_signal(signal.SIGTERM)
  start = time.monotonic()
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 42, stderr[-3000:]
  assert time.monotonic() - start < 10
  assert 'SIGTERM before the first step: nothing to checkpoint yet' in stderr
  assert not (tmp_path / 'checkpoints').exists() or not os.listdir(
      tmp_path / 'checkpoints')


@pytest.mark.parametrize('layout, message', [
    ('no checkpoints', 'holds no readable checkpoint'),
    ('torn', 'holds no readable checkpoint (step 5'),
])
def test_a_workdir_without_readable_checkpoints_as_a_model(tmp_path, layout,
                                                           message):
  trained = tmp_path / 'trained'
  first = helpers.run_main(SFT, '--config.steps=5', '--config.eval_examples=0',
                           '--config.checkpoint.every=5',
                           f'--workdir={trained}')
  assert first.returncode == 0, first.stderr[-3000:]
  if layout == 'no checkpoints':
    for step in os.listdir(trained / 'checkpoints'):
      subprocess.run(['rm', '-r', str(trained / 'checkpoints' / step)],
                     check=True)
  else:
    for root, _, files in os.walk(trained / 'checkpoints' / '5' / 'state'):
      for name in files:
        if not name.endswith('.json'):
          with open(os.path.join(root, name), 'wb') as f:
            f.write(b'torn')
  result = helpers.run_main(
      '--config=tunix_pw/configs/generate.py:runlocal',
      f'--config.model.checkpoint={trained}', '--config.prompt=1+1=',
      f'--workdir={tmp_path / "g"}')
  assert message in one_error(result)


def test_metrics_are_not_repeated_after_a_resume(tmp_path):
  args = [SFT, '--config.runtime.host_device_count=1',
          '--config.meshes.actor.axes=fsdp=1', '--config.steps=20',
          '--config.log_every=2', '--config.checkpoint.every=5',
          '--config.eval_examples=0', f'--workdir={tmp_path}']
  killed = helpers.run_main(*args, kill_at_step=8)
  assert killed.returncode == -signal.SIGKILL
  logged = (tmp_path / 'metrics.jsonl').read_text()
  assert json.loads(logged.splitlines()[-1])['step'] == 8
  with open(tmp_path / 'metrics.jsonl', 'a') as f:
    f.write('{"step": 9, "loss": 0.')  # a write cut short
  resumed = helpers.run_main(*args)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert 'resumed from step 5' in resumed.stdout
  steps = [json.loads(line)['step'] for line in
           (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert steps == list(range(2, 21, 2))


RESUME = [SFT, '--config.runtime.host_device_count=1',
          '--config.meshes.actor.axes=fsdp=1', '--config.steps=4',
          '--config.checkpoint.every=2', '--config.eval_examples=0']


@pytest.mark.parametrize('change, field', [
    ('--config.lora.rank=4', 'lora.rank'),
    ('--config.optimizer.name=sgd', 'optimizer.name'),
    ('--config.model.param_dtype=bfloat16', 'model.param_dtype'),
])
def test_a_resume_with_another_state_structure_is_refused(tmp_path, change,
                                                          field):
  first = helpers.run_main(*RESUME, f'--workdir={tmp_path}')
  assert first.returncode == 0, first.stderr[-3000:]
  again = helpers.run_main(*RESUME, change, '--config.steps=6',
                           f'--workdir={tmp_path}')
  assert f'--config.{field}=' in one_error(again)
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['2', '4']


def test_checkpoints_that_do_not_restore_are_kept_not_restarted(tmp_path):
  """Without the snapshot to compare, the restore itself fails: the run
  stops with exit 2 and the checkpoints stay (it used to start over from
  step 0, its saves never replacing the old ones)."""
  first = helpers.run_main(*RESUME, f'--workdir={tmp_path}')
  assert first.returncode == 0, first.stderr[-3000:]
  os.remove(tmp_path / 'config.json')
  again = helpers.run_main(*RESUME, '--config.lora.rank=4', '--config.steps=6',
                           f'--workdir={tmp_path}')
  assert 'holds checkpoints, but none restores into this job' in one_error(
      again)
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['2', '4']
