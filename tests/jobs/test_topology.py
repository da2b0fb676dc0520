"""Restarts onto a different topology: a checkpoint written on some devices
and processes resumes on others (Orbax restores into the new shardings),
the global batch and data position carry over, and training continues as
an uninterrupted run on the new topology would. Disaggregated RL across
controllers: the actor on one process's devices, the rollout on another's,
checkpoints written by the process that holds the state."""

import json

import numpy as np
import pytest

from tests import helpers

SFT = ['--config=tunix_pw/configs/sft.py:runlocal', '--config.log_every=1',
       '--config.checkpoint.every=2', '--config.eval_examples=0',
       '--config.batch_size=16', '--config.data.max_length=10',
       # constant: a 2-step run then 2 more follow a 4-step run's schedule
       '--config.optimizer.warmup_steps=0',
       '--config.optimizer.schedule=constant']


def place(devices: int, axes: str) -> list[str]:
  return [f'--config.runtime.host_device_count={devices}',
          f'--config.meshes.actor.axes={axes}']


def losses(workdir) -> dict[int, float]:
  with open(workdir / 'metrics.jsonl') as f:
    return {m['step']: m['loss'] for m in map(json.loads, f) if 'loss' in m}


@pytest.mark.parametrize('processes', [1, 2])
def test_a_checkpoint_resumes_on_another_topology(tmp_path, processes):
  """Written with fsdp=8 on 8 devices (one process, or two with 4 each),
  resumed by one process on 4 devices with fsdp=4."""
  run = [*SFT, '--config.steps=2', f'--workdir={tmp_path / "moved"}',
         *place(8, 'fsdp=8')]
  first = (helpers.launch_local(2, *run) if processes == 2 else
           helpers.run_main(*run))
  assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
  new = [*SFT, '--config.steps=4', *place(4, 'fsdp=4')]
  moved = helpers.run_main(*new, f'--workdir={tmp_path / "moved"}')
  assert moved.returncode == 0, moved.stderr[-3000:]
  assert (f'sft: resumed from step 2 (written on 8 devices by {processes} '
          f'process{"es" * (processes > 1)}; now 4 and 1)') in moved.stdout
  assert ("on a new placement: meshes.actor.axes 'fsdp=8' -> 'fsdp=4', "
          'runtime.host_device_count 8 -> 4') in moved.stdout
  straight = helpers.run_main(*new, f'--workdir={tmp_path / "straight"}')
  assert straight.returncode == 0, straight.stderr[-3000:]
  resumed, uninterrupted = losses(tmp_path / 'moved'), losses(
      tmp_path / 'straight')
  assert sorted(resumed) == sorted(uninterrupted) == [1, 2, 3, 4]
  np.testing.assert_allclose([resumed[s] for s in (3, 4)],
                             [uninterrupted[s] for s in (3, 4)], rtol=1e-5)
  # Not trivially equal: the later steps learn from the restored state.
  assert uninterrupted[4] < uninterrupted[1]


def test_disaggregated_grpo_across_two_controllers_resumes_bit_identical(
    tmp_path):
  """2 processes x 4 devices: the actor (and reference) on process 0's, the
  rollout on process 1's; weights cross processes by the union mesh,
  rollouts come back to process 0. SIGTERM in step 2's update on both ->
  both exit 42 with a checkpoint only process 0 wrote -> the resume ends
  bit-identical to an uninterrupted run."""
  grpo = ['--config=tunix_pw/configs/grpo.py:runlocal', '--config.steps=4',
          '--config.checkpoint.every=0', '--config.eval_examples=0',
          '--config.rl.rewards=digits:1']  # a dense reward: real updates
  straight = helpers.launch_local(2, *grpo, f'--workdir={tmp_path / "a"}')
  assert straight.returncode == 0, straight.stdout[-3000:]
  assert ('actor {\'fsdp\': 4} on 4 devices (ids 0..3)' in straight.stdout
          and 'rollout {\'fsdp\': 1, \'tp\': 4} on 4 devices (ids 2048..'
          in straight.stdout), straight.stdout[:3000]  # process 1's ids
  assert 'weight sync by union_jit' in straight.stdout
  stopped = helpers.launch_local(2, *grpo, f'--workdir={tmp_path / "b"}',
                                 **helpers.fault(phase='update', call=2,
                                                 signal='SIGTERM'))
  assert stopped.returncode == 42, stopped.stdout[-3000:]
  assert '[launch] exit codes: [42, 42]' in stopped.stdout
  data = tmp_path / 'b' / 'checkpoints' / '2' / 'data'
  [item] = [json.loads(f.read_text()) for f in data.iterdir()
            if f.suffix != '.txt']
  assert item['_topology'] == dict(devices=4, processes=1)
  resumed = helpers.launch_local(2, *grpo, f'--workdir={tmp_path / "b"}')
  assert resumed.returncode == 0, resumed.stdout[-3000:]
  assert '[p0] grpo: resumed from step 2\n' in resumed.stdout
  rewards = [m['reward_mean'] for m in map(json.loads, open(
      tmp_path / 'a' / 'metrics.jsonl')) if 'reward_mean' in m]
  assert len(set(rewards)) > 1  # learning signal, not a constant
  for a, b in zip(helpers.host_state(tmp_path / 'a', 4),
                  helpers.host_state(tmp_path / 'b', 4)):
    np.testing.assert_array_equal(a, b)


def test_an_actor_off_process_0_is_refused(tmp_path):
  """Orbax writes parts of every checkpoint from process 0: an actor on
  process 1's devices only stops before its first step, in one sentence."""
  result = helpers.launch_local(
      2, '--config=tunix_pw/configs/grpo.py:runlocal', '--config.steps=2',
      '--config.meshes.actor.devices=4:8',
      '--config.meshes.rollout.devices=0:4', f'--workdir={tmp_path}')
  assert result.returncode == 2, result.stdout[-3000:]
  assert ('[p0] error: the trained state lives on the devices of processes '
          '[1] only, and Orbax writes parts of every checkpoint from '
          'process 0') in result.stdout
  assert not (tmp_path / 'metrics.jsonl').exists()


@pytest.mark.parametrize('written, resumed_on', [
    ('fsdp=4,stage=2', 'fsdp=8'), ('fsdp=8', 'fsdp=4,stage=2')])
def test_a_checkpoint_resumes_into_and_out_of_pipeline_stages(
    tmp_path, written, resumed_on):
  """Stacked layers split over a `stage` axis are saved whole: a
  pipelined run resumes unpipelined and back, as an uninterrupted run on
  the new layout would."""
  first = helpers.run_main(*SFT, '--config.steps=2', *place(8, written),
                           f'--workdir={tmp_path / "moved"}')
  assert first.returncode == 0, first.stderr[-3000:]
  new = [*SFT, '--config.steps=4', *place(8, resumed_on)]
  moved = helpers.run_main(*new, f'--workdir={tmp_path / "moved"}')
  assert moved.returncode == 0, moved.stderr[-3000:]
  assert f"meshes.actor.axes '{written}' -> '{resumed_on}'" in moved.stdout
  straight = helpers.run_main(*new, f'--workdir={tmp_path / "straight"}')
  assert straight.returncode == 0, straight.stderr[-3000:]
  resumed, uninterrupted = losses(tmp_path / 'moved'), losses(
      tmp_path / 'straight')
  np.testing.assert_allclose([resumed[s] for s in (3, 4)],
                             [uninterrupted[s] for s in (3, 4)], rtol=1e-5)
  assert uninterrupted[4] < uninterrupted[1]
