"""The demo (README's main command), its GRPO stage cut to 10 steps: the SFT
warm-up stops between 20% and 70% held-out accuracy, GRPO runs on the
disaggregated layout with dynamic sampling, and the figures and plot come
out. How much the whole demo's GRPO raises the accuracy (at least 10
points) is a learning result: `benchmarks/demo.py` prints it."""

import re

import pytest

from tests import helpers
from tunix_pw.train import metrics


def test_demo_runs_end_to_end(tmp_path):
  result = helpers.run_main('--config=tunix_pw/configs/demo.py',
                            '--config.grpo.steps=10',
                            '--config.grpo.eval_every=5',
                            f'--workdir={tmp_path}', timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  accuracy = dict(re.findall(
      r'pipeline: after (\w+): held-out accuracy ([\d.]+)%', result.stdout))
  assert set(accuracy) == {'sft', 'grpo'}
  assert 20 <= float(accuracy['sft']) <= 70
  assert '95% CI' in result.stdout and 'n=500' in result.stdout
  logged = metrics.read(str(tmp_path / 'grpo'))
  evals = [m['step'] for m in logged if 'eval/accuracy' in m]
  assert evals == [0, 5, 10]  # the last step's eval runs once
  [final] = [m['eval/accuracy'] for m in logged
             if m['step'] == 10 and 'eval/accuracy' in m]
  assert final == pytest.approx(float(accuracy['grpo']) / 100, abs=5e-4)
  grpo = [m for m in logged if 'loss' in m]
  assert len(grpo) == 10 and grpo[0]['sync_bytes'] > 0
  assert min(m['kept_group_fraction'] for m in grpo) < 1  # groups dropped
  assert ("pipeline: grpo meshes: actor {'fsdp': 4} on 4 devices (ids 0..3), "
          "rollout {'fsdp': 1, 'tp': 4} on 4 devices (ids 4..7)"
          ) in result.stdout
  png = (tmp_path / 'progress.png').read_bytes()
  assert png[:8] == b'\x89PNG\r\n\x1a\n'
