"""The demo (README's main command): SFT warm-up lands between 20% and 70%
held-out accuracy, GRPO on the disaggregated layout then raises it by at
least 10 points, and the figures and plot come out."""

import re

from tests import helpers
from tunix_pw.train import metrics


def test_demo_runs_end_to_end(tmp_path):
  result = helpers.run_main('--config=tunix_pw/configs/demo.py',
                            f'--workdir={tmp_path}', timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  accuracy = dict(re.findall(
      r'pipeline: after (\w+): held-out accuracy ([\d.]+)%', result.stdout))
  assert set(accuracy) == {'sft', 'grpo'}
  assert 20 <= float(accuracy['sft']) <= 70
  assert float(accuracy['grpo']) >= float(accuracy['sft']) + 10
  assert '95% CI' in result.stdout and 'n=500' in result.stdout
  logged = metrics.read(str(tmp_path / 'grpo'))
  evals = [m['step'] for m in logged if 'eval/accuracy' in m]
  assert evals == [0, 50, 100, 150, 200]  # the last step's eval runs once
  grpo = [m for m in logged if 'loss' in m]
  assert len(grpo) == 200 and grpo[0]['sync_bytes'] > 0
  assert min(m['kept_group_fraction'] for m in grpo) < 1  # groups dropped
  assert ("pipeline: grpo meshes: actor {'fsdp': 4} on 4 devices (ids 0..3), "
          "rollout {'fsdp': 1, 'tp': 4} on 4 devices (ids 4..7)"
          ) in result.stdout
  png = (tmp_path / 'progress.png').read_bytes()
  assert png[:8] == b'\x89PNG\r\n\x1a\n'
