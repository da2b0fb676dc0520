"""The layout planner (`--plan_layout`): candidates on whole hosts,
rough sizes that bound the compiled peak from below, and a ranking that
holds only layouts that fit, each pasteable into a launch."""

import dataclasses
import json

import pytest

from tests import helpers
from tunix_pw import compile_only, estimate, planner
from tunix_pw.configs import grpo
from tunix_pw.errors import UsageError
from tunix_pw.models import blocks
from tunix_pw.runtime import meshes, topology

pytest.importorskip('libtpu', reason='libtpu is not installed (the test '
                    'extra installs it)')

# tiny-gemma3 GRPO, 16 samples of 32 tokens a step: 30 s a compile.
SMALL = {'rl.prompts_per_step': 4, 'rl.num_generations': 4,
         'rl.mini_batch_size': 16, 'rl.micro_batch_size': 16,
         'rl.logps_micro_batch_size': 16, 'rl.max_prompt_length': 16,
         'rl.max_new_tokens': 16, 'eval_batch_size': 16}


def small_config():
  config = grpo.get_config('tiny-gemma3')
  config.update_from_flattened_dict(SMALL)
  return config


def test_candidates_take_whole_hosts_and_divide_the_batch():
  config = small_config()
  layouts = planner.candidates(config, 8, per_host=4)
  # Shares of 1/4 and 3/4 of a v5e-8 would split its 4-chip hosts.
  assert {l.rollout_share for l in layouts} == {0.0, 0.5}
  assert {l.tp for l in layouts} == {1, 2, 4}  # tiny-gemma3: 4 heads
  samples = config.rl.prompts_per_step * config.rl.num_generations
  for layout in layouts:
    assert config.rl.mini_batch_size % layout.micro_batch == 0
    assert samples % (layout.rollout // layout.tp) == 0
    applied = layout.apply(config)
    meshes.check(applied.meshes)
    assert applied.rl.micro_batch_size == layout.micro_batch
    assert config.meshes.layout == 'disaggregated'  # the original untouched


def test_pipeline_stages_where_they_divide_the_layers():
  """tiny-gemma's 4 repeated layers take 2 and 4 stages (tiny-gemma3's
  one block none); a stage runs a row per device per micro-batch."""
  config = small_config()
  config.model.preset = 'tiny-gemma'
  layouts = planner.candidates(config, 8, per_host=4)
  assert {l.stage for l in layouts} == {1, 2, 4}
  for layout in (l for l in layouts if l.stage > 1):
    applied = layout.apply(config)
    axes = dict(meshes.parse_axes(applied.meshes.actor.axes, 'actor'))
    assert axes['stage'] == layout.stage
    assert axes['data'] * axes['fsdp'] * axes['stage'] * axes.get(
        'sequence', 1) == layout.actor
    assert applied.model.pipeline_microbatches == (  # its rows
        applied.rl.micro_batch_size // (axes['data'] * axes['fsdp']))
  assert {l.stage for l in planner.candidates(small_config(), 8, 4)} == {1}


def test_sequences_split_where_they_divide_the_tokens():
  """A sample's 32 tokens over 2 or 4 devices: a micro batch of half or a
  quarter of a sample per device, and half or a quarter of its saved
  inputs."""
  config = small_config()
  layouts = planner.candidates(config, 8, per_host=4)
  assert {l.sequence for l in layouts} == {1, 2, 4}
  for layout in (l for l in layouts if l.sequence > 1):
    applied = layout.apply(config)
    meshes.check(applied.meshes)
    axes = dict(meshes.parse_axes(applied.meshes.actor.axes, 'actor'))
    assert axes['sequence'] == layout.sequence
    assert axes['data'] * axes['fsdp'] * axes['sequence'] * axes.get(
        'stage', 1) == layout.actor
    assert applied.rl.micro_batch_size * layout.sequence == (
        layout.micro * layout.actor)
  roofline = estimate.Roofline.of(topology.parse('v5litepod-8', 'tpu'))
  whole = planner.Layout(8, 0.0, tp=1, fsdp=4, micro=1, remat='full')
  split = dataclasses.replace(whole, fsdp=2, sequence=2)
  saved = planner.size(config, whole, roofline, 1000).memory - planner.size(
      config, split, roofline, 1000).memory
  arch = blocks.architecture(config.model)
  assert saved == 32 * arch.embed_dim * arch.num_layers * 4 // 2
  config.rl.max_new_tokens = 17  # 33 tokens
  assert {l.sequence for l in planner.candidates(config, 8, 4)} == {1}


def fake_report(fits_if):
  """compile_only.report without compiling: each layout's step time from
  its micro batch, its fit decided by `fits_if(config)`."""
  def report(config, *_):
    fits = fits_if(config)
    seconds = 1.0 / config.rl.micro_batch_size
    return dict(fits=fits, peak_per_device=(1 if fits else 3) << 30,
                hbm_per_device=2 << 30, compile_seconds=0.0,
                estimate=dict(step=dict(seconds=seconds, tokens_per_s=1.0,
                                        mfu=0.1),
                              phases=[dict(name='train step', bound='hbm',
                                           seconds=seconds, per_step=1)]))
  return report


def plan(monkeypatch, fits_if, workdir=None):
  monkeypatch.setattr(compile_only, 'report', fake_report(fits_if))
  return planner.plan(small_config(), None, 'v5litepod-8', 1, workdir,
                      'pathways', lambda config: None, to_compile=5)


def test_the_ranking_holds_only_layouts_that_fit(monkeypatch, tmp_path):
  # The collocated layouts (the largest micro batches, so the fastest)
  # do not fit: none is ranked, though compiled.
  ranked = plan(monkeypatch,
                lambda c: c.meshes.layout != 'collocated', tmp_path)
  written = json.loads((tmp_path / 'layout_plan.json').read_text())
  assert any(not r['fits'] and 'collocated' in r['overrides']
             for r in written['compiled'])
  assert ranked and written['ranked'] == ranked
  assert all(r['fits'] and 'collocated' not in r['overrides'] for r in ranked)
  assert [r['step_s'] for r in ranked] == sorted(r['step_s'] for r in ranked)
  with pytest.raises(UsageError, match='no layout of the grpo job fits'):
    plan(monkeypatch, lambda c: False)


def test_planning_asks_for_an_rl_job_and_a_topology():
  result = helpers.run_main('--config=tunix_pw/configs/sft.py:tiny-gemma3',
                            '--compile_topology=v5litepod-8',
                            '--plan_layout')
  assert result.returncode == 2
  assert 'plans jobs whose meshes are actor, reference and rollout' in (
      ' '.join(helpers.error_lines(result.stderr)))
  result = helpers.run_main('--config=tunix_pw/configs/grpo.py:tiny-gemma3',
                            '--plan_layout')
  assert result.returncode == 2
  assert helpers.error_lines(result.stderr) == [
      'error: --plan_layout needs --compile_topology (a TPU type to compile '
      'for, e.g. v5p-512).']


def test_plans_tiny_gemma3_on_a_v5e_8_and_the_winner_pastes(tmp_path):
  """Two layouts compiled for real; each shape-only lower bound is below
  its compiled peak; the winner's overrides, pasted into a compile-only
  check, give its peak again."""
  small = [f'--config.{k}={v}' for k, v in SMALL.items()]
  result = helpers.run_main('--config=tunix_pw/configs/grpo.py:tiny-gemma3',
                            *small, '--compile_topology=v5litepod-8',
                            '--plan_layout', '--plan_compile=2',
                            f'--workdir={tmp_path}', timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  written = json.loads((tmp_path / 'layout_plan.json').read_text())
  assert len(written['compiled']) == 2 and written['ranked']
  for r in written['compiled']:
    assert 0 < r['rough_memory'] <= r['peak'] <= r['hbm'], r
  best = written['ranked'][0]
  assert f'| 1 | {best["step_s"]:.3g} |' in result.stdout
  check = helpers.run_main('--config=tunix_pw/configs/grpo.py:tiny-gemma3',
                           *small, *best['overrides'].split(),
                           '--compile_topology=v5litepod-8', '--estimate',
                           f'--workdir={tmp_path}', timeout=600)
  assert check.returncode == 0, check.stderr[-3000:]
  report = json.loads((tmp_path / 'compile_report.json').read_text())
  assert report['peak_per_device'] == best['peak']
  assert report['estimate']['step']['seconds'] == pytest.approx(
      best['step_s'])

