"""GRPO and its variants, 5 steps through `main`: metrics (timings aside)
and final parameters bit-identical to goldens recorded before the RL loop
was rebuilt from phases and before the non-finite step guard
(`python -m tests.jobs.test_golden` records them anew, for a deliberate
change of results)."""

import hashlib
import json
import os
import sys

import pytest

from tests import helpers
from tunix_pw.train import metrics

GOLDENS = os.path.join(os.path.dirname(__file__), 'goldens')
VARIANTS = ('grpo', 'dapo', 'drgrpo', 'gspo')
TIMINGS = ('time/', 'rollout_tokens_per_s', 'tokens_per_s', 'step_time')


def run(variant: str, workdir: str) -> dict:
  """The run's metrics.jsonl without timings, and a digest of its exported
  final parameters."""
  export = os.path.join(workdir, 'export')
  result = helpers.run_main(
      f'--config=tunix_pw/configs/grpo.py:runlocal,{variant}',
      '--config.steps=5', '--config.log_every=1', '--config.eval_examples=50',
      # Partial credit: a random model's groups differ, so every step learns.
      '--config.rl.rewards=digits:1.0,format:0.1,overlong:0.5',
      # Two updates per rollout (importance ratios, old log-probabilities).
      '--config.rl.mini_batch_size=32',
      f'--config.export={export}', f'--workdir={workdir}')
  assert result.returncode == 0, result.stderr[-3000:]
  with open(os.path.join(export, 'model.safetensors'), 'rb') as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  logged = [{k: v for k, v in m.items() if not k.startswith(TIMINGS)}
            for m in metrics.read(workdir)]
  return dict(metrics=logged, params_sha256=digest)


@pytest.mark.parametrize('variant', VARIANTS)
def test_bit_identical_to_goldens(tmp_path, variant):
  with open(os.path.join(GOLDENS, f'{variant}.json')) as f:
    golden = json.load(f)
  got = run(variant, str(tmp_path))
  # Every recorded value (metrics added since, such as `skipped`, aside).
  assert [{k: m.get(k) for k in g} for m, g in zip(
      got['metrics'], golden['metrics'])] == golden['metrics']
  assert len(got['metrics']) == len(golden['metrics'])
  assert got['params_sha256'] == golden['params_sha256']


if __name__ == '__main__':
  import tempfile  # pylint: disable=g-import-not-at-top
  for name in sys.argv[1:] or VARIANTS:
    with tempfile.TemporaryDirectory() as tmp:
      with open(os.path.join(GOLDENS, f'{name}.json'), 'w') as f:
        json.dump(run(name, tmp), f, indent=1)
    print('recorded', name)
