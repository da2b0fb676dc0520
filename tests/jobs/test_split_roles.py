"""Sequence and pipeline parallelism in every role's pass, not only the
actor's: the reference's log-probabilities and the critic's values (PPO),
the teacher's distributions (distillation). A job whose roles split their
tokens over `sequence`, or their layers over `stage`, logs the figures of
the same job unsplit (its first step: before rounding compounds)."""

import json

import numpy as np
import pytest

from tests import helpers
from tests.jobs.test_golden import TIMINGS

JOBS = {
    'ppo': (['--config=tunix_pw/configs/ppo.py:runlocal', '--config.steps=1',
             '--config.log_every=1', '--config.eval_examples=0',
             '--config.rl.rewards=digits:1.0,format:0.1,overlong:0.5'],
            ('actor', 'reference', 'critic')),
    'distill': (['--config=tunix_pw/configs/distill.py:runlocal',
                 '--config.steps=1', '--config.log_every=1',
                 '--config.eval_examples=0'], ('actor', 'teacher')),
}


def first_step(workdir) -> dict[str, float]:
  with open(workdir / 'metrics.jsonl') as f:
    step = next(m for m in map(json.loads, f) if m['step'] == 1)
  return {k: v for k, v in step.items() if not k.startswith(TIMINGS)}


@pytest.mark.slow
@pytest.mark.parametrize('job, unsplit, axes', [
    ('ppo', 'fsdp=4', 'fsdp=2,sequence=2'),  # the rollout on the other 4
    ('ppo', 'fsdp=4', 'fsdp=2,stage=2'),
    ('distill', 'fsdp=8', 'fsdp=4,sequence=2')])
def test_split_roles_log_the_unsplit_figures(tmp_path, job, unsplit, axes):
  flags, roles = JOBS[job]
  runs = {}
  for name, role_axes in (('whole', unsplit), ('split', axes)):
    result = helpers.run_main(
        *flags, *[f'--config.meshes.{r}.axes={role_axes}' for r in roles],
        f'--workdir={tmp_path / name}')
    assert result.returncode == 0, result.stderr[-3000:]
    runs[name] = first_step(tmp_path / name)
  whole, split = runs['whole'], runs['split']
  assert split.keys() == whole.keys() and len(whole) > 5
  for key in whole:
    np.testing.assert_allclose(split[key], whole[key], rtol=1e-5, atol=1e-6,
                               err_msg=key)
