"""The step-time estimator (tunix_pw/estimate.py) calibrated on this CPU:
its estimate of each GRPO phase against the measured time of the same
compiled program.

The roofline is this CPU's, measured: the float32 matmul peak (a jitted
2048 x 2048 product) and the memory bandwidth (a jitted scale of a 256 MiB
array, read and written), both medians of 5; one device, so no network.
The workload is benchmarks/grpo_step.py's (16 samples of 32+32 or 64+128
tokens, reference KL) on one CPU device, every role on it; its programs
are the job's compile plan (`compile_plan`, what a compile-only check
compiles), each run on placeholder arguments of its shapes (median of 5
after a warm-up). The rollout is a sampler of the same model generating
the step's samples (no stop): its decode per token is the difference to
a generation of one new token over the extra tokens, its prefill that
one-token generation less one decode step.

Then one published TPU figure, as a compile-only estimate: MaxText's 16B
model on one v5e-256 at 120 TFLOP/s per chip, 61.10% MFU
(MaxText/configs/v5e/README.md; configs/v5e/16b.sh, measured in October
2023: `global_parameter_scale=16`, so 32 layers, width 5120, 32 heads of
256 without grouped KV, a ReLU MLP of 32768 (not gated), a tied
vocabulary of 32768; 6 rows of 2048 tokens per chip, full remat,
bfloat16, FSDP over the 256 chips). Its step time follows from its own
FLOPs count (6 N T B + 12 H L D T^2 B per chip, N = 16,274,101,248) over
its TFLOP/s. Our SFT train step of the nearest model our families build
(Gemma's sequential block, a gated MLP of 21845 with the same FLOPs as
its two matrices of 32768, causal attention) is compiled for a v5e-256
and estimated; the error is ours over theirs.

  python benchmarks/calibrate.py [--workloads=small,large] [--maxtext]

Prints a table, then one JSON line. Target (issue 55): within +-30% for
the train step and the prefill on the large workload.
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import grpo_step  # pylint: disable=g-import-not-at-top,wrong-import-position
import sampler as sampler_bench  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw import compile_only, estimate, jobs  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.configs import common, grpo, sft  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.models import checkpoints, presets  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.models.config import ModelConfig  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.runtime import meshes as meshes_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.sampling import sampler as sampler_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.sampling.rollout import SamplingConfig  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.train import plans  # pylint: disable=g-import-not-at-top,wrong-import-position

PHASES = ('train step', 'reference logps')
MAXTEXT_16B = ModelConfig(
    family='gemma', vocab_size=32768, embed_dim=5120, num_layers=32,
    num_heads=32, num_kv_heads=32, head_dim=256, mlp_dim=21845)
MAXTEXT_ROWS, MAXTEXT_LENGTH, MAXTEXT_CHIPS = 6, 2048, 256


def maxtext_16b() -> dict:
  """The published step time of MaxText's 16B on a v5e-256 against our
  estimate of the same training step."""
  n, t, b = 16_274_101_248, MAXTEXT_LENGTH, MAXTEXT_ROWS
  flops = 6 * n * t * b + 12 * 32 * 32 * 256 * t * t * b
  published = flops / 120e12
  presets.PRESETS['maxtext-16b'] = MAXTEXT_16B
  config = sft.get_config('maxtext-16b')
  config.update_from_flattened_dict({
      'batch_size': MAXTEXT_ROWS * MAXTEXT_CHIPS,
      'data.max_length': MAXTEXT_LENGTH, 'model.dtype': 'bfloat16',
      'model.remat': 'full', 'eval_examples': 0})
  config.meshes = common.meshes('collocated', actor=('fsdp=-1', 'all'))
  report = compile_only.report(config, jobs.get('sft'), 'v5litepod-256', 1,
                               with_estimate=True)
  [row] = [r for r in report['estimate']['phases']
           if r['name'] == 'train step']
  return dict(workload='maxtext-16b v5e-256', phase='train step',
              bound=row['bound'], estimated_ms=round(row['seconds'] * 1e3),
              measured_ms=round(published * 1e3),
              error=round(row['seconds'] / published - 1, 3))


def median_seconds(call, make_args=lambda: (), runs: int = 5) -> float:
  """Median wall time of `call(*make_args())` after one warm-up (the
  arguments made afresh each time, outside the timing: calls may donate
  them)."""
  times = []
  for _ in range(runs + 1):
    args = make_args()
    start = time.perf_counter()
    jax.block_until_ready(call(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times[1:])


def cpu_roofline() -> estimate.Roofline:
  a = jnp.ones((2048, 2048), jnp.float32)
  flops = 2 * 2048 ** 3 / median_seconds(jax.jit(lambda a: a @ a),
                                         lambda: (a,))
  x = jnp.ones((64 << 20,), jnp.float32)
  hbm = 2 * x.nbytes / median_seconds(jax.jit(lambda x: x * 1.5),
                                      lambda: (x,))
  return estimate.Roofline(flops, hbm, ici=1.0, shape=(1,))


def placeholder(info):
  """An array for one argument: floats (parameters) drawn like an
  initialisation, so that sampling does not end at once; integers and
  masks ones (a valid token, position, mask); keys from key 0."""
  key = jax.random.key(0)
  if jax.dtypes.issubdtype(info.dtype, jax.dtypes.prng_key):
    return jax.random.split(key, max(1, int(np.prod(info.shape)))).reshape(
        info.shape)
  if jnp.issubdtype(info.dtype, jnp.floating):
    return 0.02 * jax.random.normal(key, info.shape, info.dtype)
  return jnp.ones(info.shape, info.dtype)


def run_seconds(compiled) -> float:
  def make_args():
    args, kwargs = jax.tree.map(placeholder, compiled.args_info)
    return args, kwargs
  return median_seconds(lambda args, kwargs: compiled(*args, **kwargs),
                        make_args)


def config_for(name: str, new: int):
  prompt, _ = grpo_step.LENGTHS[name]
  samples = grpo_step.PROMPTS * grpo_step.GENERATIONS
  config = grpo.get_config('runlocal')
  config.model.preset = f'bench-{name}'
  config.update_from_flattened_dict({
      'rl.prompts_per_step': grpo_step.PROMPTS,
      'rl.num_generations': grpo_step.GENERATIONS,
      'rl.mini_batch_size': samples, 'rl.micro_batch_size': samples,
      'rl.logps_micro_batch_size': samples, 'rl.max_prompt_length': prompt,
      'rl.max_new_tokens': new, 'rl.kl_beta': grpo_step.KL_BETA,
      'rl.top_p': grpo_step.TOP_P, 'eval_examples': 0})
  config.meshes = common.meshes('collocated', actor=('fsdp=1', 'all'),
                                reference=('fsdp=1', 'actor'),
                                rollout=('fsdp=1', 'all'))
  return config


def phases_of(config) -> dict:
  meshes = meshes_lib.build(config.meshes, jax.devices()[:1])
  plan = jobs.get('grpo').compile_plan(config, meshes)
  return {p.name: p for p in plan.phases if p.name in PHASES}


def rollout_seconds(name: str, roofline: estimate.Roofline) -> tuple:
  """The rollout's estimated rows, and its measured prefill and decode: a
  sampler on one device generating the step's samples (every new token,
  no stop), and the same with one new token."""
  prompt, new = grpo_step.LENGTHS[name]
  mesh = meshes_lib.build(common.meshes('collocated', rollout=(
      'fsdp=1', 'all')), jax.devices()[:1])['rollout']
  model = checkpoints.init(sampler_bench.model_config(name), seed=0,
                           mesh=mesh, rules=common.sharding())
  engine = sampler_lib.Sampler(model, pad_id=0, eos_ids=(1,), mesh=mesh,
                               rules=common.sharding())
  prompts = np.random.default_rng(1).integers(
      4, 100, (grpo_step.PROMPTS, prompt)).tolist()

  def sampling(tokens):
    return SamplingConfig(max_new_tokens=tokens, top_p=grpo_step.TOP_P,
                          ignore_eos=True, generations=grpo_step.GENERATIONS)
  phase = plans.Phase('rollout', 'rollout', lambda: engine.programs(
      grpo_step.PROMPTS, prompt, sampling(new)), decode_steps=new)
  rows = estimate.rows(phase, list(phase.compile()), roofline, 1)
  whole, first = (median_seconds(
      lambda t=tokens: engine.generate(prompts, sampling(t)).tokens)
                  for tokens in (new, 1))
  per_token = (whole - first) / (new - 1)
  return rows, {'rollout prefill': first - per_token,
                'rollout decode': per_token * new}


def calibrate(name: str, roofline: estimate.Roofline) -> list[dict]:
  _, new = grpo_step.LENGTHS[name]
  estimated, measured = {}, {}
  for phase_name, phase in phases_of(config_for(name, new)).items():
    programs = list(phase.compile())
    for row in estimate.rows(phase, programs, roofline, 1):
      estimated[row.name] = row
    measured[phase_name] = run_seconds(programs[0])
  rows, times = rollout_seconds(name, roofline)
  estimated.update((row.name, row) for row in rows)
  measured.update(times)
  return [dict(workload=name, phase=phase_name, bound=row.bound,
               estimated_ms=round(row.seconds * 1e3, 2),
               measured_ms=round(measured[phase_name] * 1e3, 2),
               error=round(row.seconds / measured[phase_name] - 1, 3))
          for phase_name, row in estimated.items()]


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--workloads', default='small,large')
  parser.add_argument('--maxtext', action='store_true',
                      help="also MaxText's published 16B figure (minutes "
                      'of compiling)')
  args = parser.parse_args()
  names = [n for n in args.workloads.split(',') if n]
  for name in names:
    presets.PRESETS[f'bench-{name}'] = sampler_bench.model_config(name)
  roofline = cpu_roofline()
  print(f'this CPU: {roofline.flops / 1e9:.1f} GFLOP/s float32 matmul, '
        f'{roofline.hbm / 1e9:.1f} GB/s memory', flush=True)
  rows = []
  print('| workload | phase | bound | estimated ms | measured ms | error |\n'
        '|' + ' --- |' * 6, flush=True)
  for name in names:
    for row in calibrate(name, roofline):
      rows.append(row)
      print(f'| {name} | {row["phase"]} | {row["bound"]} | '
            f'{row["estimated_ms"]} | {row["measured_ms"]} | '
            f'{row["error"]:+.0%} |', flush=True)
  if args.maxtext:
    row = maxtext_16b()
    rows.append(row)
    print(f'| {row["workload"]} | {row["phase"]} | {row["bound"]} | '
          f'{row["estimated_ms"]} | {row["measured_ms"]} (published) | '
          f'{row["error"]:+.0%} |', flush=True)
  print(json.dumps(dict(benchmark='calibrate', matmul_gflops=round(
      roofline.flops / 1e9, 1), memory_gbps=round(roofline.hbm / 1e9, 1),
                        rows=rows)))


if __name__ == '__main__':
  main()
