"""SFT on images: a tiny Gemma 3 vision-language model (our initialisation,
saved with a tokenizer and processor as a checkpoint ships) learns the
synthetic bars task (which of two bars is taller) from its pixels alone:
chance is 50%, every answer depends on the image."""

import re

import pytest

from tests import helpers
from tests.models import hf_models

# Full fine-tuning, and LoRA on the tower's and the decoder's weights.
MODES = {'full': [],
         'lora': ['--config.lora.rank=8',
                  '--config.lora.targets=.*(attn/(q|k|v|o)|mlp/(up|down))',
                  '--config.optimizer.learning_rate=1e-2']}


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp('vision'))
  hf_models.vision_checkpoint(directory, {}, fresh=True)
  return directory


@pytest.mark.parametrize('mode', sorted(MODES))
def test_sft_learns_the_bars_task_from_pixels(checkpoint, tmp_path, mode):
  result = helpers.run_main(
      '--config=tunix_pw/configs/sft.py:runlocal',
      f'--config.model.checkpoint={checkpoint}', '--config.data.name=bars',
      '--config.data.max_length=64', '--config.eval_verifier=exact',
      '--config.steps=120', '--config.eval_examples=200', *MODES[mode],
      f'--workdir={tmp_path / "w"}', timeout=600)
  assert result.returncode == 0, result.stderr
  accuracy = float(re.search(r'held-out greedy exact match ([\d.]+)%',
                             result.stdout).group(1))
  assert accuracy >= 80, result.stdout  # chance: 50


def test_packing_refuses_images(checkpoint, tmp_path):
  result = helpers.run_main(
      '--config=tunix_pw/configs/sft.py:runlocal',
      f'--config.model.checkpoint={checkpoint}', '--config.data.name=bars',
      '--config.data.packing=true', f'--workdir={tmp_path / "w"}')
  assert result.returncode == 2, result.stderr
  [line] = helpers.error_lines(result.stderr)
  assert '--config.data.packing packs no images yet' in line


def test_images_for_a_text_model_exit_2(tmp_path):
  result = helpers.run_main('--config=tunix_pw/configs/sft.py:runlocal',
                            '--config.data.name=bars',
                            f'--workdir={tmp_path / "w"}')
  assert result.returncode == 2, result.stderr
  [line] = helpers.error_lines(result.stderr)
  assert ("--config.data.name='bars' has images, but the gemma model has no "
          'vision tower.') in line
