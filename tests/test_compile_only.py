"""Compile-only checks against a TPU topology on this CPU (libtpu, no TPU):
real Gemma presets, the job's own programs, XLA's memory analysis."""

import json

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import ml_collections
import numpy as np
import pytest

from tests import helpers
from tunix_pw.configs import dpo as dpo_config, ppo as ppo_config
from tunix_pw.configs import reward_model as rm_config
from tunix_pw.jobs import dpo, ppo, reward_model
from tunix_pw.models import blocks, presets
from tunix_pw.runtime import meshes, topology

# libtpu comes with the test extra (jax[tpu]); without it there is no TPU
# compiler to check against.
pytest.importorskip('libtpu', reason='libtpu is not installed (the test '
                    'extra installs it)')

GIB = 1 << 30
# gemma3-1b GRPO, sized for a v5e-16 (16 GiB per chip): bfloat16 compute,
# micro batches of 4 (libtpu compiles the train step in about 40 s; 50 s
# with 8); the rollout on half the chips.
GRPO_GEMMA3_1B = (
    '--config=tunix_pw/configs/grpo.py:gemma3-1b',
    '--config.model.dtype=bfloat16',
    '--config.rl.prompts_per_step=8', '--config.rl.mini_batch_size=64',
    '--config.rl.micro_batch_size=4', '--config.rl.logps_micro_batch_size=4',
    '--config.rl.max_prompt_length=128', '--config.rl.max_new_tokens=128',
    '--config.runtime.reshard_group_mib=1024', '--compile_topology=v5litepod-16')
GEMMA3_1B_PARAMS = 999_885_952  # embedding 262144 x 1152 included


def test_grpo_gemma3_1b_fits_a_v5e_16(tmp_path):
  result = helpers.run_main(*GRPO_GEMMA3_1B, '--estimate',
                            f'--workdir={tmp_path}', timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / 'compile_report.json').read_text())
  assert (report['devices'], report['chips'], report['hbm_per_device']) == (
      16, 16, 16 * GIB)
  assert report['fits'] and 0 < report['peak_per_device'] <= 16 * GIB
  assert set(report['programs']) == {
      'train step', 'rollout', 'evaluation', 'weight sync in',
      'weight sync out', 'reference logps', 'reference copy in',
      'reference copy out', 'log-probabilities to actor in',
      'log-probabilities to actor out'}
  # Actor and rollout have 8 devices each: the sync's source side needs no
  # coarsening program, the target side one relayout per parameter.
  counts = {k: p['count'] for k, p in report['programs'].items()}
  # The train step, its finite check and the preset's random init.
  assert counts == {'train step': 3, 'rollout': 1, 'evaluation': 1,
                    'weight sync in': 57, 'weight sync out': 0,
                    'reference logps': 1,
                    'reference copy in': 106, 'reference copy out': 0,
                    'log-probabilities to actor in': 1,
                    'log-probabilities to actor out': 0}
  # Default layout: actor (+ reference) on chips 0-7, rollout on 8-15.
  groups = {tuple(g['roles']): g for g in report['groups']}
  actor, rollout = groups[('actor', 'reference')], groups[('rollout',)]
  assert actor['devices'] == list(range(8))
  assert rollout['devices'] == list(range(8, 16))
  # f32 parameters sharded over 8 chips: their share, up to the few small
  # dimensions that do not divide the mesh and are replicated.
  share = GEMMA3_1B_PARAMS * 4 / 8
  for resident in (actor['resident']['params'],
                   actor['resident']['reference']):
    assert share <= resident <= 1.01 * share
  # The rollout copy is split over tp=4 only (data=2 holds two copies), and
  # the single KV head's projections are whole on every device.
  assert 2 * share < rollout['resident']['rollout copy'] <= 1.05 * 2 * share
  assert actor['resident']['optimizer'] >= 2 * share  # adam's two moments
  # The step's estimate: each phase as often as a step runs it (64
  # samples: one update, 16 reference passes of 4), evaluation outside it.
  phases = {p['name']: p for p in report['estimate']['phases']}
  calls = {k: p['per_step'] for k, p in phases.items()}
  assert calls == {'train step': 1, 'rollout prefill': 1, 'rollout decode': 1,
                   'evaluation prefill': 0, 'evaluation decode': 0,
                   'reference logps': 16, 'weight sync in': 1,
                   'reference copy in': 0,
                   'log-probabilities to actor in': 1}
  # The train step's matrix work per device: 6 x parameters x tokens over
  # the 8 actor devices, and attention's (measured: 1.13 times that).
  tokens = 64 * 256
  assert (6 * GEMMA3_1B_PARAMS * tokens / 8 <= phases['train step']['flops']
          <= 1.3 * 6 * GEMMA3_1B_PARAMS * tokens / 8)
  # A decode step reads the rollout copy of the weights: 128 of them.
  decode = phases['rollout decode']
  assert decode['hbm_bytes'] >= 128 * rollout['resident']['rollout copy'] / 2
  step = report['estimate']['step']
  assert step['seconds'] == pytest.approx(sum(
      p['seconds'] * p['per_step'] for p in phases.values()))
  assert 0 < step['mfu'] < 1
  assert 'estimated step' in result.stdout and 'MFU' in result.stdout
  assert actor['peak'] == sum(actor['resident'].values()) + max(
      actor['phases'].values())
  assert 'peak' in result.stdout and 'fits' in result.stdout


def test_a_multi_controller_sync_compiles_union_jit(tmp_path):
  """Disaggregated on a v5e-16's 4 hosts (actor on host 0, rollout on host
  1): a multi-controller job moves weights between processes by union_jit,
  one select program over both sides per parameter (so on the actor side
  too), then the relayouts; a Pathways job by two_hop's relayouts alone."""
  counts = {}
  for backend in ('pathways', 'multi_controller'):
    result = helpers.run_main(
        '--config=tunix_pw/configs/grpo.py:runlocal',
        '--compile_topology=v5litepod-16', f'--compile_backend={backend}',
        f'--workdir={tmp_path / backend}')
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / backend /
                         'compile_report.json').read_text())
    assert report['backend'] == backend
    counts[backend] = {k: p['count'] for k, p in report['programs'].items()}
  pathways, multi = counts['pathways'], counts['multi_controller']
  leaves = multi['weight sync out']
  assert pathways['weight sync out'] == 0 and 0 < pathways['weight sync in']
  assert leaves == 11  # tiny-gemma's parameter leaves
  assert multi['weight sync in'] == leaves + pathways['weight sync in']


@pytest.mark.parametrize('algorithm', ['dpo', 'kto'])
def test_dpo_compiles_its_train_step_and_reference(tmp_path, algorithm):
  """A DPO (KTO) check through main: the train step on pairs (on each
  pair's two sides as examples, with their mismatched sequences) and the
  reference's log-probabilities, the reference copy resident beside the
  actor's state."""
  result = helpers.run_main(
      '--config=tunix_pw/configs/dpo.py:tiny-gemma3', '--config.batch_size=16',
      f'--config.dpo.algorithm={algorithm}',
      '--config.data.max_length=64', '--compile_topology=v5litepod-16',
      f'--workdir={tmp_path}', timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / 'compile_report.json').read_text())
  # The train step, its finite check and the preset's random init; the
  # reference's train and held-out passes, and its copy of the policy.
  assert {k: p['count'] for k, p in report['programs'].items()} == {
      'train step': 3, 'reference logps': 2, 'evaluation': 1,
      'reference copy in': 80, 'reference copy out': 0}
  [group] = report['groups']
  assert group['roles'] == ['actor', 'reference']
  resident = group['resident']
  assert set(resident) == {'params', 'optimizer', 'reference'}
  assert resident['reference'] == resident['params']
  assert group['peak'] == sum(resident.values()) + max(
      group['phases'].values())


@pytest.mark.parametrize('algorithm, lora, phases, resident', [
    ('dpo', 0, ['train step', 'evaluation', 'reference logps'],
     {'params', 'optimizer', 'reference'}),
    # A LoRA policy's reference is its own frozen base: no second copy.
    ('dpo', 4, ['train step', 'evaluation', 'reference logps'],
     {'params', 'optimizer', 'frozen base'}),
    ('orpo', 0, ['train step', 'evaluation'], {'params', 'optimizer'}),
    ('kto', 0, ['train step', 'evaluation', 'reference logps'],
     {'params', 'optimizer', 'reference'}),
    ('kto', 4, ['train step', 'evaluation', 'reference logps'],
     {'params', 'optimizer', 'frozen base'}),
])
def test_dpo_plan_by_algorithm_and_lora(algorithm, lora, phases, resident):
  """The plan itself, on this CPU's devices (nothing compiled)."""
  config = dpo_config.get_config('runlocal')
  config.dpo.algorithm, config.lora.rank = algorithm, lora
  plan = dpo.compile_plan(config, meshes.build(config.meshes, jax.devices()))
  assert [p.name for p in plan.phases] == phases
  assert {role: set(items) for role, items in plan.resident.items()} == {
      'actor': resident}


def test_oversized_sft_exits_2_with_the_numbers(tmp_path):
  """float32 SFT on 64 rows of 2048 tokens over 2 slices of v5e-16: the
  train step's temporaries alone exceed a chip (XLA refuses to compile)."""
  result = helpers.run_main(
      '--config=tunix_pw/configs/sft.py:gemma3-1b',
      '--config.batch_size=64',
      '--config.data.max_length=2048', '--compile_topology=v5litepod-16',
      '--compile_num_slices=2', f'--workdir={tmp_path}', timeout=600)
  assert result.returncode == 2, result.stderr[-3000:]
  errors = helpers.error_lines(result.stderr)
  assert len(errors) == 1 and 'Traceback' not in result.stderr
  assert 'the sft job does not fit 2 x v5litepod-16' in errors[0]
  assert 'of 16.00 GiB HBM' in errors[0] and 'train step' in errors[0]
  assert 'out of HBM while compiling' in result.stdout
  report = json.loads((tmp_path / 'compile_report.json').read_text())
  assert (report['devices'], report['num_slices']) == (32, 2)
  assert not report['fits'] and report['peak_per_device'] > 16 * GIB
  # The parameters' share is still counted: 1/32 of them per device.
  params = report['groups'][0]['resident']['params']
  assert GEMMA3_1B_PARAMS * 4 / 32 <= params <= 1.01 * GEMMA3_1B_PARAMS * 4 / 32


@pytest.mark.parametrize('args, says', [
    (('--config=tunix_pw/configs/grpo.py:gemma3-1b',
      '--compile_topology=v5p-96'), 'powers of two'),
    (('--config=tunix_pw/configs/eval.py:gemma3-1b',
      '--compile_topology=v5p-8'), 'has no compile plan'),
    # The default disaggregated layout on 2 slices: the rollout on slice 1.
    (('--config=tunix_pw/configs/grpo.py:gemma3-1b',
      '--compile_topology=v5litepod-16', '--compile_num_slices=2'),
     "the rollout role is on slices [1] only, and libtpu cannot compile a "
     "program without slice 0's devices"),
])
def test_bad_compile_requests(args, says):
  result = helpers.run_main(*args)
  assert result.returncode == 2
  assert says in ' '.join(helpers.error_lines(result.stderr))


def test_a_trained_workdir_gives_its_models_architecture(tmp_path):
  """A workdir's config.json is its run config, not a Hugging Face one: the
  architecture comes from the run's model block."""
  (tmp_path / 'checkpoints').mkdir()
  (tmp_path / 'config.json').write_text(json.dumps(
      {'model': dict(preset='tiny-gemma3', checkpoint='', tokenizer='')}))
  block = ml_collections.ConfigDict(dict(preset='gemma3-1b',
                                         checkpoint=str(tmp_path)))
  assert blocks.architecture(block) == presets.PRESETS['tiny-gemma3']
  block.checkpoint = ''
  assert blocks.architecture(block) == presets.PRESETS['gemma3-1b']


def test_ppo_counts_its_critic_on_its_own_devices(tmp_path):
  """PPO through main: the critic's train step and values pass compile on
  the critic's devices, its parameters and optimizer state resident there;
  the policy trains on per-token advantages."""
  result = helpers.run_main(
      '--config=tunix_pw/configs/ppo.py:tiny-gemma3',
      '--config.rl.prompts_per_step=32', '--config.rl.mini_batch_size=32',
      '--config.rl.micro_batch_size=8', '--config.rl.logps_micro_batch_size=8',
      '--config.rl.max_prompt_length=32',
      '--config.rl.max_new_tokens=32', '--config.meshes.actor.axes=fsdp=4',
      '--config.meshes.actor.devices=0:4',
      '--config.meshes.reference.axes=fsdp=4',
      '--config.meshes.critic.devices=4:8', '--compile_topology=v5litepod-16',
      f'--workdir={tmp_path}', timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads((tmp_path / 'compile_report.json').read_text())
  groups = {tuple(g['roles']): g for g in report['groups']}
  critic = groups[('critic',)]
  assert critic['devices'] == [4, 5, 6, 7]
  assert set(critic['phases']) == {'critic train step', 'critic values'}
  assert set(critic['resident']) == {'critic params', 'critic optimizer'}
  # The same decoder without its (tied) LM head, plus a [D, 1] head.
  actor = groups[('actor', 'reference')]
  assert 0 < critic['resident']['critic params'] - actor['resident'][
      'params'] < 4096
  assert {'train step', 'old logps', 'reference logps'} <= set(
      actor['phases'])


def test_a_shared_critic_is_resident_beside_the_actor():
  config = ppo_config.get_config('runlocal')
  config.meshes.critic.devices = 'actor'
  plan = ppo.compile_plan(config, meshes.build(config.meshes, jax.devices()))
  assert {'params', 'optimizer', 'reference', 'critic params',
          'critic optimizer'} <= set(plan.resident['actor'])


def test_reward_model_plan_counts_its_value_model():
  """The reward model's train step on pairs of full-length rows and its
  held-out margins compile; its parameters and optimizer state are
  resident."""
  config = rm_config.get_config('runlocal')
  plan = reward_model.compile_plan(config, meshes.build(config.meshes,
                                                        jax.devices()))
  assert [p.name for p in plan.phases] == ['train step', 'evaluation']
  assert set(plan.resident['actor']) == {'params', 'optimizer'}
  for phase in plan.phases:
    assert phase.compile()  # lowers and compiles on these CPU devices


def test_libtpu_cannot_compile_a_program_without_slice_0():
  """Why compile_only refuses a role off slice 0: the same program
  compiles on slice 0's devices and not on slice 1's. When libtpu lifts
  this, this test fails: drop the refusal."""
  devices = topology.devices(topology.parse('v5litepod-16'), 2)

  def compile_on(slice_index):
    mesh = Mesh(np.array([d for d in devices
                          if d.slice_index == slice_index]), ('x',))
    sharding = NamedSharding(mesh, PartitionSpec('x'))
    return jax.jit(lambda a: 2 * a, out_shardings=sharding).lower(
        jax.ShapeDtypeStruct((16, 8), np.float32, sharding=sharding)
    ).compile()

  compile_on(0)
  with pytest.raises(jax.errors.JaxRuntimeError, match='Slice is empty'):
    compile_on(1)
