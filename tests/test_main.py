"""main.py as users run it: bad configs exit 2 with one sentence; a resume
into an incompatible workdir is refused; the smoke job runs."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests import helpers

SMOKE = 'tunix_pw/configs/smoke.py'


@pytest.mark.parametrize('args, expected', [
    # Static checks, before any device work.
    (['--config=missing.py'], 'no readable config file'),
    ([f'--config={SMOKE}', '--config.stpes=3'], "did you mean 'steps'"),
    ([f'--config={SMOKE}', '--config.steps=abc'], 'is not a valid int'),
    ([f'--config={SMOKE}', '--config.job=foo'], "--config.job='foo' is not a registered job"),
    ([f'--config={SMOKE}', '--config.model.preset=huge'],
     "--config.model.preset='huge' is unknown"),
    ([f'--config={SMOKE}', '--config.batch_size=30'], 'does not divide'),
    ([f'--config={SMOKE}', '--config.meshes.actor.axes=fsdp=0'],
     "axis 'fsdp' has size 0"),
    ([f'--config={SMOKE}', '--config.meshes.layout=mixed'], 'layout'),
    ([f'--config={SMOKE}:nonsense'], 'get_config failed'),
    (['--config=tunix_pw/configs/sft.py:runlocal', '--config.logits_chunk=-1'],
     '--config.logits_chunk=-1 must be an integer of at least 0'),
    (['--config=tunix_pw/configs/grpo.py:runlocal',
      '--config.rl.logits_chunk=-2'], 'rl.logits_chunk=-2 must be'),
    (['--config=tunix_pw/configs/distill.py:runlocal',
      '--config.distill.strategy=attention', '--config.logits_chunk=8'],
     "the attention strategy reads every layer's internals"),
    (['--config=tunix_pw/configs/sft.py:runlocal',
      '--config.data.manual_dir=/data'], 'not read by the arithmetic dataset'),
    (['--config=tunix_pw/configs/sft.py:runlocal',
      '--config.meshes.actor.axes=fsdp=2,stage=3'],
     "splits the model's 4 repeated blocks of 1 layers 3 ways"),
    (['--config=tunix_pw/configs/sft.py:runlocal',
      '--config.meshes.actor.axes=fsdp=2,stage=4',
      '--config.model.pipeline_microbatches=2'],
     'pipeline_microbatches=2 is fewer than the 4 pipeline stages'),
    # Topology checks, right after the runtime starts.
    ([f'--config={SMOKE}', '--config.meshes.actor.axes=fsdp=8'],
     'needs 8 devices'),
    ([f'--config={SMOKE}', '--config.meshes.rollout.devices=4:12'],
     'the job has 8 devices'),
    ([f'--config={SMOKE}', '--config.meshes.rollout.devices=2:6'],
     'overlaps --config.meshes.actor.devices'),
    ([f'--config={SMOKE}:collocated', '--config.meshes.rollout.devices=0:4'],
     'layout is collocated'),
])
def test_bad_config_exits_2_with_one_sentence(tmp_path, args, expected):
  result = helpers.run_main(*args, f'--workdir={tmp_path}')
  assert result.returncode == 2, result.stderr
  lines = helpers.error_lines(result.stderr)
  assert len(lines) == 1, result.stderr
  assert expected in lines[0]
  assert 'Traceback' not in result.stderr
  # Nothing half-written: a failed start leaves no snapshot behind.
  assert not os.path.exists(tmp_path / 'config.json')


def test_missing_workdir_exits_2():
  result = helpers.run_main(f'--config={SMOKE}')
  assert result.returncode == 2
  assert '--workdir is required' in helpers.error_lines(result.stderr)[0]


def test_smoke_runs_then_resumes_on_new_meshes_but_not_a_new_model(tmp_path):
  result = helpers.run_main(f'--config={SMOKE}', '--config.steps=3',
                            f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr
  summary = json.loads((tmp_path / 'smoke_summary.json').read_text())
  assert summary['backend'] == 'local' and summary['devices'] == 8
  assert len(summary['losses']) == 3
  assert summary['losses'][-1] < summary['losses'][0]
  snapshot = json.loads((tmp_path / 'config.json').read_text())
  assert snapshot['steps'] == 3

  # More steps into the same workdir is a compatible resume...
  again = helpers.run_main(f'--config={SMOKE}', '--config.steps=4',
                           f'--workdir={tmp_path}')
  assert again.returncode == 0, again.stderr
  # ...and so is one on other meshes, the change said in one line...
  moved = helpers.run_main(f'--config={SMOKE}', '--config.steps=4',
                           '--config.meshes.actor.axes=fsdp=2,tp=2',
                           f'--workdir={tmp_path}')
  assert moved.returncode == 0, moved.stderr
  assert (f"resuming {tmp_path} on a new placement: meshes.actor.axes "
          "'fsdp=4,tp=1' -> 'fsdp=2,tp=2'") in moved.stdout
  # ...a different model is not.
  refused = helpers.run_main(f'--config={SMOKE}', '--config.model.preset=wide',
                             f'--workdir={tmp_path}')
  assert refused.returncode == 2
  [line] = helpers.error_lines(refused.stderr)
  assert '--config.model.preset=' in line and 'snapshot' in line


@pytest.mark.skipif(not importlib.util.find_spec('torch'),
                    reason='torch is not installed (the test-core extra)')
def test_a_job_starts_without_importing_torch(tmp_path):
  """tensorboardX imports torch wherever it is installed (the test extra
  installs it), about a second of every job's start: the metrics writer
  hides it, and the event files are still written."""
  wrapper = ('import runpy, sys\n'
             'sys.argv = ["main"] + sys.argv[1:]\n'
             'try:\n'
             '  runpy.run_module("tunix_pw.main", run_name="__main__")\n'
             'finally:\n'
             '  print("torch imported:", "torch" in sys.modules)\n')
  result = subprocess.run(
      [sys.executable, '-c', wrapper,
       '--config=tunix_pw/configs/sft.py:runlocal',
       '--config.runtime.host_device_count=1',
       '--config.meshes.actor.axes=fsdp=1', '--config.steps=1',
       '--config.eval_examples=0', f'--workdir={tmp_path}'],
      cwd=helpers.ROOT, env=helpers.env(), capture_output=True, text=True,
      timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'torch imported: False' in result.stdout
  assert os.listdir(tmp_path / 'tensorboard')


def test_micro_batches_that_do_not_divide_a_pass_exit_2(tmp_path):
  """Checked before anything starts: the workdir is never written."""
  result = helpers.run_main(
      '--config=tunix_pw/configs/sft.py:runlocal', '--config.steps=1',
      '--config.meshes.actor.axes=fsdp=4,stage=2',
      '--config.model.pipeline_microbatches=3',
      f'--workdir={tmp_path / "w"}')
  assert result.returncode == 2, result.stderr[-3000:]
  assert helpers.error_lines(result.stderr) == [
      'error: --config.model.pipeline_microbatches=3 does not divide the 64 '
      'rows of a pipelined pass (--config.batch_size / micro_batches); use a '
      'divisor of 64 of at least 2 (the stages).']
  assert not (tmp_path / 'w').exists()
