"""Distillation through main: the teacher on the actor's devices and on
its own mesh (outputs moved by reshard), top-k and JSD, the loss mix, a
mismatched tokenizer refused, and the compile-only plan; on-policy
distillation (the GRPO job's `distill` variant) likewise."""

import json

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from tests import helpers
from tests.models import tiny_tokenizers
from tests.rl import test_loss
from tunix_pw.configs import distill as distill_config, grpo as grpo_config
from tunix_pw.jobs import distill, grpo
from tunix_pw.models import blocks, safetensors_io
from tunix_pw.rl import plan as plan_lib
from tunix_pw.runtime import meshes
from tunix_pw.train import distill_losses, distill_strategies, metrics

DISTILL = '--config=tunix_pw/configs/distill.py:runlocal'
PULSE = ['--config.steps=2', '--config.log_every=1', '--config.eval_examples=0',
         '--config.data.train_examples=64']
OWN_MESH = ['--config.meshes.layout=disaggregated',
            '--config.meshes.actor.axes=fsdp=4',
            '--config.meshes.actor.devices=0:4',
            '--config.meshes.teacher.axes=fsdp=1,tp=4',
            '--config.meshes.teacher.devices=4:8']


# Teachers of other families than the student (tiny Gemma), same tokenizer.
@pytest.mark.parametrize('extra', [
    ['--config.teacher.preset=tiny-llama3',
     '--config.distill.divergence=reverse_kl'],
    OWN_MESH + ['--config.teacher.preset=tiny-qwen3',
                '--config.distill.top_k=8', '--config.distill.divergence=jsd',
                '--config.distill.temperature=2.0'],
    # 4 student layers onto 6, by relative depth.
    ['--config.teacher.preset=tiny-gemma3',
     '--config.distill.strategy=attention'],
])
def test_pulse(tmp_path, extra):
  result = helpers.run_main(DISTILL, *PULSE, *extra, f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  logged = [m for m in metrics.read(str(tmp_path)) if 'loss' in m]
  assert [m['step'] for m in logged] == [1, 2]
  for m in logged:  # the loss is the NLL plus the (weighted) strategy's
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


@pytest.mark.parametrize('strategy, top_k, teacher_on_own_mesh', [
    ('logit', 0, False), ('logit', 8, True), ('attention', 0, True),
    ('feature', 0, False)])
def test_the_plan_holds_the_teacher_resident_on_its_mesh(
    strategy, top_k, teacher_on_own_mesh):
  config = distill_config.get_config('runlocal')
  config.distill.update(strategy=strategy, top_k=top_k)
  config.teacher.preset = 'tiny-gemma3'
  if teacher_on_own_mesh:
    config.meshes.layout = 'disaggregated'
    config.meshes.actor.update(axes='fsdp=4', devices='0:4')
    config.meshes.teacher.update(axes='fsdp=1,tp=4', devices='4:8')
  plan = distill.compile_plan(config, meshes.build(config.meshes,
                                                   jax.devices()))
  assert [p.name for p in plan.phases] == [
      'train step', 'teacher outputs', 'evaluation']
  teacher_role = 'teacher' if teacher_on_own_mesh else 'actor'
  assert 'teacher' in plan.resident[teacher_role]
  assert {'params', 'optimizer'} <= set(plan.resident['actor'])


@pytest.mark.parametrize('flags', [
    ['--config.distill.top_k=16'], ['--config.distill.strategy=attention'],
    ['--config.distill.strategy=feature', '--config.lora.rank=4']])
def test_compile_only_through_main(tmp_path, flags):
  """The student's step and the teacher's forward pass (top-k logits,
  attention maps, layer outputs) compile for a v5e-16 slice; the teacher's
  copy is resident beside the student."""
  result = helpers.run_main(
      '--config=tunix_pw/configs/distill.py:tiny-gemma3',
      '--config.batch_size=16', '--config.data.max_length=64', *flags,
      '--compile_topology=v5litepod-16',
      f'--workdir={tmp_path}', timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / 'compile_report.json').read_text())
  # Beside each program, the random init of its preset (no checkpoint);
  # the train step's phase also holds the finite check. The held-out
  # evaluation generates on the student, after moving its weights in.
  counts = {k: p['count'] for k, p in report['programs'].items()}
  assert counts['evaluation weights in'] > 0
  assert {k: v for k, v in counts.items() if 'weights' not in k} == {
      'train step': 3, 'teacher outputs': 2, 'evaluation': 1}
  [group] = report['groups']
  assert set(group['resident']) - {'frozen base'} == {'params', 'optimizer',
                                                      'teacher'}


OPD = '--config=tunix_pw/configs/grpo.py:runlocal,distill'
OPD_PULSE = ['--config.log_every=1', '--config.eval_examples=0',
             '--config.checkpoint.every=0']


def test_on_policy_distillation_from_an_identical_teacher_moves_nothing(
    tmp_path):
  """The advantage of each sampled token is log pi_T - log pi_S: a teacher
  equal to the student gives 0 everywhere, so the policy-gradient step
  leaves every weight as it was (and the KL metric is 0). Here without
  the whole distributions' term (`distill.weight=0`)."""
  result = helpers.run_main(OPD, *OPD_PULSE, '--config.steps=1',
                            '--config.distill.weight=0',
                            f'--workdir={tmp_path / "w"}')
  assert result.returncode == 0, result.stderr[-3000:]
  [logged] = [m for m in metrics.read(str(tmp_path / 'w')) if 'loss' in m]
  assert logged['kl'] == 0.0 and logged['loss'] == 0.0
  assert logged['grad_norm'] == 0.0 and 'distill' not in logged


def test_on_policy_distillation_pulls_the_student_to_the_teacher(tmp_path):
  """A teacher of another family on the reference role, the student
  sampling on its own rollout mesh: the student's KL to the teacher on
  its own samples falls, and so does the divergence of the whole
  distributions (of the teacher's top 8 tokens at each sampled
  position)."""
  result = helpers.run_main(OPD, *OPD_PULSE, '--config.steps=6',
                            '--config.teacher.preset=tiny-llama3',
                            '--config.distill.top_k=8',
                            '--config.optimizer.learning_rate=3e-3',
                            f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  assert "rollout {'fsdp': 1, 'tp': 4} on 4 devices (ids 4..7)" in \
      result.stdout
  logged = [m for m in metrics.read(str(tmp_path)) if 'loss' in m]
  for key in ('kl', 'distill'):
    assert logged[-1][key] < 0.8 * logged[0][key], [m[key] for m in logged]


def test_on_policy_distillation_refuses_another_tokenizer(tmp_path):
  tokenizer = tiny_tokenizers.make('qwen3', str(tmp_path / 'tok'))
  result = helpers.run_main(OPD, f'--config.teacher.tokenizer={tokenizer}',
                            '--check_only', f'--workdir={tmp_path / "w"}')
  assert result.returncode == 2
  [line] = helpers.error_lines(result.stderr)
  assert "does not share the student's tokenizer" in line


def test_on_policy_distillation_plan_holds_the_teacher():
  config = grpo_config.get_config('runlocal,distill')
  config.teacher.preset = 'tiny-gemma3'
  plan = grpo.compile_plan(config, meshes.build(config.meshes,
                                                jax.devices()))
  names = [p.name for p in plan.phases]
  assert 'teacher logps' in names and 'old logps' in names
  assert 'teacher' in plan.resident['actor']  # the reference role's devices
  # The train step's batch carries the teacher's logits, whole or top-k.
  mesh = meshes.build(config.meshes, jax.devices())['actor']
  length = config.rl.max_prompt_length + config.rl.max_new_tokens
  vocab = blocks.architecture(config.teacher).vocab_size
  for top_k, width in ((0, vocab), (8, 8)):
    config.distill.top_k = top_k
    shapes = plan_lib.batch_shapes(config, 16, mesh)
    assert shapes['teacher_logits'].shape == (16, length, width)
    assert ('teacher_indices' in shapes) == bool(top_k)


def test_feature_distillation_and_its_projection(tmp_path):
  """From a 6-layer Gemma 3 teacher, mean-pooled: the student's projection
  is trained (the checkpoint's has left its start, the identity's corner,
  off the diagonal too, which no decay could move), never exported, and
  its workdir loads as a plain checkpoint."""
  result = helpers.run_main(DISTILL, *PULSE,
                            '--config.distill.strategy=feature',
                            '--config.distill.layers=1:2,3:5',
                            '--config.distill.pooling=mean',
                            '--config.teacher.preset=tiny-gemma3',
                            f'--config.export={tmp_path / "export"}',
                            f'--workdir={tmp_path / "w"}')
  assert result.returncode == 0, result.stderr[-3000:]
  logged = [m for m in metrics.read(str(tmp_path / 'w')) if 'loss' in m]
  assert all(m['kd'] > 0 for m in logged)
  path = str(tmp_path / 'w' / 'checkpoints' / '2' / 'state')
  checkpointer = ocp.PyTreeCheckpointer()
  params = checkpointer.restore(path, restore_args=jax.tree.map(
      lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
      checkpointer.metadata(path).item_metadata.tree))['params']
  projection = params['distill_projection']['value']
  assert projection.shape == (2, 128, 128)  # mapped layers, D_s, D_t
  # Adam's first step (learning rate 3e-3 at step 2, after a step of
  # warmup at 0) moves every weight with a gradient by about 3e-3.
  moved = np.abs(projection - np.eye(128)) > 1e-4
  assert moved[:, ~np.eye(128, dtype=bool)].mean() > 0.5, moved.mean()
  exported = safetensors_io.SafetensorsDir(str(tmp_path / 'export')).names()
  assert not any('distill' in name for name in exported)
  again = helpers.run_main(
      '--config=tunix_pw/configs/generate.py:runlocal',
      f'--config.model.checkpoint={tmp_path / "w"}', '--config.prompt=12+30=',
      f'--workdir={tmp_path / "g"}')
  assert again.returncode == 0, again.stderr[-3000:]


@pytest.mark.parametrize('flags, says', [
    (['--config.distill.strategy=attention', '--config.distill.layers=0:9'],
     'pairs student layer 0 with teacher layer 9, but the student has 4 '
     'layers and the teacher 4'),
    (['--config.distill.strategy=feature', '--config.distill.layers=0-1'],
     "must be student:teacher layer pairs"),
    (['--config.distill.strategy=hidden'],
     "strategy='hidden' is not a registered distill_strategy; use one of "
     'attention, feature, logit.'),
    (['--config.distill.pooling=max'], "pooling='max' must be one of token"),
])
def test_distillation_config_errors(tmp_path, flags, says):
  result = helpers.run_main(DISTILL, *flags, '--check_only',
                            f'--workdir={tmp_path}')
  assert result.returncode == 2
  [line] = helpers.error_lines(result.stderr)
  assert says in line


@pytest.mark.parametrize('top_k', [0, 8])
def test_chunked_logits_give_the_whole_distillation_loss_and_gradients(top_k):
  """Logit distillation on Gemma 3's 262,144-entry vocabulary with the
  student's logits 3 positions at a time (the last chunk padded) against
  all 10 at once, the teacher's logits whole or its top-k: the loss, its
  sums and the gradients within 1e-6 relative (float32)."""
  model = test_loss.big_vocabulary_model()
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(3)
  n, t, vocab = 2, 10, model.cfg.vocab_size
  batch = dict(
      tokens=jnp.asarray(rng.integers(0, vocab, (n, t)), jnp.int32),
      positions=jnp.tile(jnp.arange(t), (n, 1)),
      segment_ids=jnp.asarray([[1] * t, [1] * 6 + [2] * 3 + [0]], jnp.int32),
      loss_mask=jnp.asarray(rng.integers(0, 2, (n, t)), jnp.int32),
      **distill_losses.teacher_outputs(
          jnp.asarray(rng.normal(size=(n, t, vocab)), jnp.float32), top_k))
  d = distill_config.get_config('runlocal').distill
  d.update(top_k=top_k, temperature=2.0)

  def objective(state, chunk):
    return distill_strategies.distill_loss(nnx.merge(graphdef, state), batch, None, d=d,
                                student_layers=(), chunk=chunk)

  assert test_loss.assert_chunks_change_nothing(objective, state, t)['kd'] > 0


def test_a_chunked_step_holds_a_fraction_of_the_whole_logits():
  """The gradient of the logit-distillation loss of 4 x 2,048 tokens over
  262,144 entries (the teacher's top 8) compiles with temporaries under a
  quarter of the unchunked one's (measured: 5.7 against 28.7 GiB, as for
  SFT's NLL alone), which holds the student's whole float32 logits, 8 GiB
  (nothing runs)."""
  model = test_loss.big_vocabulary_model()
  graphdef, state = nnx.split(model)
  rows = jax.ShapeDtypeStruct((4, 2048), jnp.int32)
  top = jax.ShapeDtypeStruct((4, 2048, 8), jnp.float32)
  batch = dict(tokens=rows, positions=rows, segment_ids=rows, loss_mask=rows,
               teacher_logits=top,
               teacher_indices=jax.ShapeDtypeStruct(top.shape, jnp.int32))
  d = distill_config.get_config('runlocal').distill
  d.top_k = 8

  def temp_bytes(chunk):
    program = jax.jit(jax.grad(lambda s, b: distill_strategies.distill_loss(
        nnx.merge(graphdef, s), b, None, d=d, student_layers=(),
        chunk=chunk)[0]))
    return program.lower(state, batch).compile().memory_analysis(
        ).temp_size_in_bytes

  whole = temp_bytes(2048)
  assert whole >= 4 * 2048 * 262_144 * 4
  assert temp_bytes(0) < whole / 4  # the default chunk: 128
