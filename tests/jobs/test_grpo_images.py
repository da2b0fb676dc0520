"""The GRPO family on image prompts: the rollout prefills each prompt with
its images, and the trainer's log-probabilities of those samples are the
rollout's (the images reach both); from a checkpoint that answers the bars
task at chance, GRPO learns it from the exact-answer reward."""

import json
import re

import pytest

from tests import helpers
from tests.models import hf_models

GRPO = ('--config=tunix_pw/configs/grpo.py:runlocal',
        '--config.data.name=bars', '--config.rl.max_prompt_length=56',
        '--config.rl.rewards=exact:1.0', '--config.eval_verifier=exact',
        '--config.eval_examples=200')


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('vision'))
  hf_models.vision_checkpoint(directory, {}, fresh=True)
  return directory


def accuracies(stdout: str) -> list[float]:
  return [float(a) for a in re.findall(
      r'held-out greedy exact match ([\d.]+)%', stdout)]


def test_the_trainer_sees_the_rollouts_images(checkpoint, tmp_path):
  """Two steps with the mismatch metrics: the trainer's log-probabilities
  of the sampled tokens equal the rollout engine's (without the images on
  one side, they would differ by the whole image's evidence)."""
  result = helpers.run_main(
      *GRPO, f'--config.model.checkpoint={checkpoint}', '--config.steps=2',
      '--config.eval_examples=0', '--config.rl.mismatch_metrics=true',
      f'--workdir={tmp_path / "w"}')
  assert result.returncode == 0, result.stderr
  steps = [json.loads(line) for line in
           (tmp_path / 'w' / 'metrics.jsonl').read_text().splitlines()]
  first = next(s for s in steps if 'mismatch/kl' in s)
  assert abs(first['mismatch/kl']) < 1e-5, first
  assert 0.999 < first['mismatch/ratio_p05'] <= first['mismatch/ratio_p95'] \
      < 1.001, first


def test_grpo_learns_the_bars_task_from_pixels(checkpoint, tmp_path):
  """SFT for 70 steps teaches the answer's form (left or right) at chance;
  30 GRPO steps then learn which, from the images."""
  sft = tmp_path / 'sft'
  result = helpers.run_main(
      '--config=tunix_pw/configs/sft.py:runlocal',
      f'--config.model.checkpoint={checkpoint}', '--config.data.name=bars',
      '--config.data.max_length=64', '--config.eval_verifier=exact',
      '--config.steps=70', '--config.eval_examples=0',
      f'--config.export={sft}', f'--workdir={tmp_path / "s"}', timeout=600)
  assert result.returncode == 0, result.stderr
  result = helpers.run_main(
      *GRPO, f'--config.model.checkpoint={sft}', '--config.steps=30',
      '--config.optimizer.learning_rate=1e-3', f'--workdir={tmp_path / "g"}',
      timeout=600)
  assert result.returncode == 0, result.stderr
  before, after = accuracies(result.stdout)
  assert before < 65 and after >= 75, result.stdout


def test_tree_rollouts_refuse_image_prompts(tmp_path):
  result = helpers.run_main(*GRPO, '--config.rl.tree.chains=2',
                            f'--workdir={tmp_path / "w"}')
  assert result.returncode == 2, result.stderr
  [line] = helpers.error_lines(result.stderr)
  assert 'a tree rollout grows no image prompts yet (bars has images)' in line
