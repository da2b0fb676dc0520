"""Distillation through main: the teacher on the actor's devices and on
its own mesh (outputs moved by reshard), top-k and JSD, the loss mix, a
mismatched tokenizer refused, and the compile-only plan."""

import json

import jax
import numpy as np
import pytest

from tests import helpers
from tests.models import tiny_tokenizers
from tunix_pw.configs import distill as distill_config
from tunix_pw.jobs import distill
from tunix_pw.runtime import meshes
from tunix_pw.train import metrics

DISTILL = '--config=tunix_pw/configs/distill.py:runlocal'
PULSE = ['--config.steps=2', '--config.log_every=1', '--config.eval_examples=0',
         '--config.data.train_examples=64']
OWN_MESH = ['--config.meshes.layout=disaggregated',
            '--config.meshes.actor.axes=fsdp=4', '--config.meshes.actor.devices=0:4',
            '--config.meshes.teacher.axes=fsdp=1,tp=4',
            '--config.meshes.teacher.devices=4:8']


# Teachers of other families than the student (tiny Gemma), same tokenizer.
@pytest.mark.parametrize('extra', [
    ['--config.teacher.preset=tiny-llama3'],
    ['--config.teacher.preset=tiny-qwen3', '--config.distill.top_k=8',
     '--config.distill.divergence=jsd', '--config.distill.temperature=2.0'],
    OWN_MESH + ['--config.teacher.preset=tiny-gemma2',
                '--config.distill.divergence=reverse_kl',
                '--config.distill.top_k=8'],
])
def test_pulse(tmp_path, extra):
  result = helpers.run_main(DISTILL, *PULSE, *extra, f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  logged = [m for m in metrics.read(str(tmp_path)) if 'loss' in m]
  assert [m['step'] for m in logged] == [1, 2]
  for m in logged:  # the loss is the NLL plus the (weighted) divergence
    assert m['kd'] > 0
    np.testing.assert_allclose(m['loss'], m['nll'] + m['kd'], rtol=1e-5)
  if OWN_MESH[0] in extra:
    assert "teacher {'fsdp': 1, 'tp': 4} on 4 devices (ids 4..7)" in \
        result.stdout


def test_a_teacher_that_tokenizes_differently_is_exit_2(tmp_path):
  tokenizer = tiny_tokenizers.make('gemma', str(tmp_path / 'tok'))
  result = helpers.run_main(DISTILL, *PULSE,
                            f'--config.teacher.tokenizer={tokenizer}',
                            f'--workdir={tmp_path / "w"}')
  assert result.returncode == 2
  [line] = helpers.error_lines(result.stderr)
  assert "does not share the student's tokenizer" in line
  assert not (tmp_path / 'w' / 'checkpoints').exists()


@pytest.mark.parametrize('top_k, teacher_on_own_mesh', [(0, False),
                                                         (8, True)])
def test_the_plan_holds_the_teacher_resident_on_its_mesh(top_k,
                                                         teacher_on_own_mesh):
  config = distill_config.get_config('runlocal')
  config.distill.top_k = top_k
  if teacher_on_own_mesh:
    config.meshes.layout = 'disaggregated'
    config.meshes.actor.update(axes='fsdp=4', devices='0:4')
    config.meshes.teacher.update(axes='fsdp=1,tp=4', devices='4:8')
  plan = distill.compile_plan(config, meshes.build(config.meshes,
                                                   jax.devices()))
  assert [p.name for p in plan.phases] == ['train step', 'teacher logits']
  teacher_role = 'teacher' if teacher_on_own_mesh else 'actor'
  assert 'teacher' in plan.resident[teacher_role]
  assert {'params', 'optimizer'} <= set(plan.resident['actor'])


def test_compile_only_through_main(tmp_path):
  """The student's step and the teacher's top-k forward pass compile for a
  v5e-16 slice; the teacher's copy is resident beside the student."""
  result = helpers.run_main(
      '--config=tunix_pw/configs/distill.py:tiny-gemma3',
      '--config.batch_size=16', '--config.data.max_length=64',
      '--config.distill.top_k=16', '--compile_topology=v5litepod-16',
      f'--workdir={tmp_path}', timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / 'compile_report.json').read_text())
  assert {k: p['count'] for k, p in report['programs'].items()} == {
      'train step': 1, 'teacher logits': 1}
  [group] = report['groups']
  assert set(group['resident']) == {'params', 'optimizer', 'teacher'}
