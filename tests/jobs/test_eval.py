"""The eval job's pulse, on a random tiny model: each mode runs through
`main`, prints its line and writes eval.json (trained models' accuracy is
checked in test_trainers.py)."""

import json

import pytest

from tests import helpers


@pytest.mark.parametrize('mode, keys', [
    ('exact_match', {'accuracy', 'correct', 'total', 'ci_low', 'ci_high'}),
    ('loss', {'loss', 'tokens', 'total'}),
])
def test_pulse(tmp_path, mode, keys):
  result = helpers.run_main(
      '--config=tunix_pw/configs/eval.py:runlocal', f'--config.mode={mode}',
      '--config.examples=40', '--config.batch_size=20',
      f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  written = json.loads((tmp_path / 'eval.json').read_text())
  assert set(written) == keys and written['total'] == 40
  assert f'eval: arithmetic/test {mode}: ' in result.stdout
  if mode == 'loss':  # a random model: near log(vocabulary), not 0
    assert 1 < written['loss'] < 20


def test_an_unknown_verifier_exits_2(tmp_path):
  result = helpers.run_main('--config=tunix_pw/configs/eval.py:runlocal',
                            '--config.verifier=vibes', f'--workdir={tmp_path}')
  assert result.returncode == 2
  assert helpers.error_lines(result.stderr) == [
      "error: --config.verifier='vibes' is not a registered verifier; use "
      'one of exact, exact_answer, math_equal.']


def test_pass_at_k_of_a_trained_model(trained_sft, tmp_path):
  """pass@4 and maj@4 from 8 samples a problem at temperature 1, beside
  greedy accuracy, of the adder SFT trained to 90% (conftest)."""
  _, workdir = trained_sft
  result = helpers.run_main(
      '--config=tunix_pw/configs/eval.py:runlocal',
      f'--config.model.checkpoint={workdir}', '--config.examples=100',
      '--config.k=4', '--config.n=8', f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  written = json.loads((tmp_path / 'eval.json').read_text())
  assert written['accuracy'] >= 0.8, written
  # The majority of 4 is right only where some sample is: maj@4 <= pass@4;
  # a model right 80% of the time greedily is right at least once in 4.
  assert 0.5 < written['maj@4'] <= written['pass@4'] <= 1, written
  assert 'pass@4' in result.stdout


@pytest.mark.parametrize('flags, says', [
    (['--config.k=1'], '--config.k=1 must be 0 (greedy only) or at least 2'),
    (['--config.k=4', '--config.n=2'],
     '--config.n=2 must be at least --config.k=4'),
])
def test_pass_at_k_settings_are_checked(tmp_path, flags, says):
  result = helpers.run_main('--config=tunix_pw/configs/eval.py:runlocal',
                            *flags, f'--workdir={tmp_path}')
  assert result.returncode == 2
  assert says in result.stderr
