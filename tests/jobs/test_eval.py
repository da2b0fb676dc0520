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
      "error: --config.verifier='vibes' is not a verifier; use one of "
      'exact_answer, math_equal, exact.']
