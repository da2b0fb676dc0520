"""PPO through main: the critic shared with the actor (collocated) and on
its own mesh (disaggregated), learning its values; critic warm-up; a
resume that restores both states; token rewards; config errors."""

import subprocess
import sys

import numpy as np
import pytest

from tests import helpers
from tests.jobs.test_grpo import COLLOCATED, PULSE, SPLIT_REWARD
from tunix_pw.configs import ppo as ppo_config
from tunix_pw.rl import batch as batch_lib, critic, phases
from tunix_pw.train import metrics

PPO = '--config=tunix_pw/configs/ppo.py:runlocal'
OWN_CRITIC = ['--config.meshes.actor.axes=fsdp=2',
              '--config.meshes.actor.devices=0:2',
              '--config.meshes.reference.axes=fsdp=2',
              '--config.meshes.critic.axes=fsdp=2',
              '--config.meshes.critic.devices=2:4']
BY_LENGTH = '--config.rl.rewards=by_length:1'  # varies between samples


def run_ppo(*extra, workdir):
  """PPO through main, with the test rewards of `SPLIT_REWARD`."""
  return subprocess.run(
      [sys.executable, '-c', SPLIT_REWARD, PPO, *extra, f'--workdir={workdir}'],
      cwd=helpers.ROOT, env=helpers.env(), capture_output=True, text=True,
      timeout=300)


def logged(workdir):
  return [m for m in metrics.read(str(workdir)) if 'critic/loss' in m]


@pytest.mark.parametrize('where', ['own mesh', 'shared, collocated'])
def test_pulse_and_the_critic_learns(tmp_path, where):
  extra = OWN_CRITIC if where == 'own mesh' else COLLOCATED
  result = run_ppo('--config.steps=4', '--config.eval_examples=0',
                   '--config.checkpoint.every=0', BY_LENGTH,
                   '--config.critic.optimizer.learning_rate=1e-2', *extra,
                   workdir=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  steps = logged(tmp_path)
  assert [m['step'] for m in steps] == [1, 2, 3, 4]
  for key in ('loss', 'entropy', 'kl', 'clip_fraction', 'critic/grad_norm',
              'critic/value_clip_fraction', 'return_mean', 'time/values'):
    assert np.isfinite(steps[-1][key]), key
  # Values start at 0 (a zero head) and move towards the returns (about
  # the completion lengths): the critic's loss falls.
  assert steps[0]['critic/value_mean'] == 0
  assert steps[-1]['critic/value_mean'] > 0.5
  assert steps[-1]['critic/loss'] < 0.8 * steps[0]['critic/loss']


def test_warmup_trains_the_critic_alone_then_both(tmp_path):
  result = run_ppo(*PULSE, BY_LENGTH, '--config.critic.warmup_steps=1',
                   workdir=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  first, second = logged(tmp_path)
  assert first['warmup'] == 1 and 'entropy' not in first
  assert first['loss'] == first['critic/loss']
  assert second['warmup'] == 0 and 'entropy' in second


def test_resume_after_sigkill_restores_policy_and_critic(tmp_path):
  # The exact-answer reward (0 for a random model) plus the KL penalty:
  # small returns, but values and losses that move every step.
  args = (PPO, '--config.steps=3', '--config.eval_examples=0',
          '--config.checkpoint.every=1')
  whole = helpers.run_main(*args, f'--workdir={tmp_path / "whole"}')
  assert whole.returncode == 0, whole.stderr[-3000:]
  killed = helpers.run_main(*args, f'--workdir={tmp_path / "resumed"}',
                            kill_at_step=2)
  assert killed.returncode != 0
  resumed = helpers.run_main(*args, f'--workdir={tmp_path / "resumed"}')
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert 'resumed from step 2' in resumed.stdout
  last = lambda w: logged(w)[-1]
  for key in ('loss', 'critic/loss', 'critic/value_mean', 'reward_mean'):
    assert last(tmp_path / 'whole')[key] == last(tmp_path / 'resumed')[key]


def test_token_rewards_on_the_last_token_with_the_kl_penalty():
  group = batch_lib.Group([5, 6], '1', [[7, 8, 1], [9, 1]], [False, False],
                          np.array([1.0, 0.5]), {}, [[0.0] * 3, [0.0] * 2])
  result = phases.Rollout([group], [1.0], {})
  arrays = batch_lib.to_arrays([group], [1.0], 6, 0, None)
  rl = ppo_config.get_config().rl
  old = np.full((2, 5), -1.0, np.float32)
  ref = np.full((2, 5), -1.5, np.float32)
  rewards = critic.token_rewards(result, arrays, dict(old_logps=old,
                                                      ref_logps=ref), rl)
  # Completion tokens are predicted at positions 1..3 and 1..2; each token
  # pays kl_beta * (log pi_old - log pi_ref) = 0.02 * 0.5.
  np.testing.assert_allclose(rewards, [[0, -0.01, -0.01, 0.99, 0],
                                       [0, -0.01, 0.49, 0, 0]], atol=1e-7)


@pytest.mark.parametrize('config,flag,says', [
    ('ppo', '--config.rl.advantage=grpo', "PPO's advantages are its critic's"),
    ('grpo', '--config.rl.advantage=gae', 'gae needs a critic'),
    ('ppo', '--config.critic.init=copy', "critic.init='copy' is unknown"),
    ('ppo', '--config.rl.lam=1.5', 'must lie in [0, 1]')])
def test_config_errors(tmp_path, config, flag, says):
  result = helpers.run_main(f'--config=tunix_pw/configs/{config}.py:runlocal',
                            flag, '--check_only', f'--workdir={tmp_path}')
  assert result.returncode == 2
  [line] = helpers.error_lines(result.stderr)
  assert says in line
