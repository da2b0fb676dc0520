"""docs/extending.md's recipe: algorithms registered outside the package
(examples/extending/my_extensions.py), imported by a config file, run
through main like the built-in ones."""

import os

import pytest

from tests import helpers
from tunix_pw.train import metrics

HERE = os.path.join(helpers.ROOT, 'examples', 'extending')


def run(config: str, tmp_path, *flags: str):
  result = helpers.run_main(
      f'--config={os.path.join(HERE, config)}', '--config.steps=2',
      '--config.log_every=1', *flags, f'--workdir={tmp_path}',
      PYTHONPATH=os.pathsep.join((helpers.ROOT, HERE)))
  assert result.returncode == 0, result.stderr[-3000:]
  return [m for m in metrics.read(str(tmp_path)) if 'loss' in m]


def test_a_registered_preference_loss_trains(tmp_path):
  """The hinge loss max(0, 1 - beta * margin): 1 at the first step, where
  the policy is its reference (DPO's would be log 2, IPO's 25)."""
  steps = run('my_dpo.py', tmp_path)
  assert steps[0]['loss'] == pytest.approx(1.0, abs=1e-6)
  assert steps[0]['margin'] == pytest.approx(0.0, abs=1e-6)


def test_a_registered_advantage_and_reward_run_grpo(tmp_path):
  """`median_baseline` and `short_answer` exist only in the extension: the
  run validates them and logs the reward."""
  steps = run('my_grpo.py', tmp_path, '--config.eval_examples=8')
  assert [m['step'] for m in steps] == [1, 2]
  assert all(0.0 <= m['reward/short_answer'] <= 1.0 for m in steps)


def test_a_registered_token_advantage_runs_on_policy_distillation(tmp_path):
  """`teacher_favoured` keeps log pi_T - log pi_S only where it is
  positive: the first step's loss (the ratio is 1, so minus the mean
  advantage) is below 0, where on-policy distillation's own is the
  student's KL to the teacher, above 0."""
  [first] = run('my_on_policy_distill.py', tmp_path, '--config.steps=1',
                '--config.teacher.preset=tiny-llama3',
                '--config.distill.weight=0', '--config.eval_examples=0')
  assert first['loss'] < 0 < first['kl']


def test_a_registered_environment_and_tool_make_warm_up_episodes(tmp_path):
  """`adder`'s demonstrations call the `add` tool, which really runs: the
  warm-up trains on them (a tool that added wrongly would fail the run:
  a demonstration must solve its example)."""
  steps = run('my_agent_warmup.py', tmp_path, '--config.eval_examples=8')
  assert [m['step'] for m in steps] == [1, 2]


def test_without_the_import_the_name_is_a_config_error(tmp_path):
  result = helpers.run_main(
      '--config=tunix_pw/configs/dpo.py:runlocal',
      '--config.dpo.algorithm=hinge', '--check_only', f'--workdir={tmp_path}')
  assert result.returncode == 2
  [line] = helpers.error_lines(result.stderr)
  assert "--config.dpo.algorithm='hinge' is not a registered" in line
