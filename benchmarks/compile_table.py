"""Compile-only HBM per device of real-size Gemma GRPO jobs on TPU pods.

Runs `tunix_pw.main --compile_topology` (libtpu topology descriptions, no
TPU) for gemma2-2b, gemma2-9b and gemma3-27b GRPO on v5p-128, v5p-512 and
v5p-2048, and gemma2-9b on 4 slices of v5litepod-256, as Pathways jobs;
gemma2-2b and gemma2-9b on a v6e-256 as multi-controller jobs. One
process each.
Every job is the grpo config's real-size default (32+ prompts x 8
generations, prompts of 256 and 512 new tokens, actor + reference on half
the chips, rollout on the other half; collocated on several slices) with
bfloat16 compute and full remat; micro batches grow with the actor's
devices so that each holds one sample.
With each, the step's estimated time, tokens/s, MFU and its longest
phase (`--estimate`: tunix_pw/estimate.py). Prints a markdown table, then
one JSON line. Slow (minutes per row): run by
hand, the output goes into benchmarks/README.md.

  python benchmarks/compile_table.py [--only=gemma2-2b,gemma2-9b@v5p-512]
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tunix_pw.models import presets  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.runtime import topology  # pylint: disable=g-import-not-at-top,wrong-import-position

GIB = 1 << 30
PATHWAYS, MULTI = 'pathways', 'multi_controller'
ROWS = [(model, tpu, 1, PATHWAYS)
        for model in ('gemma2-2b', 'gemma2-9b', 'gemma3-27b')
        for tpu in ('v5p-128', 'v5p-512', 'v5p-2048')]
ROWS.append(('gemma2-9b', 'v5litepod-256', 4, PATHWAYS))
# Multi-controller (XPK mcjax): the same disaggregated layout, actor +
# reference on hosts 0-31, rollout on hosts 32-63; weights cross hosts by
# union_jit. (Not a slice each: libtpu 0.0.42 and 0.0.50 refuse to compile
# a program without slice 0's devices, "Slice is empty".)
ROWS += [(model, 'v6e-256', 1, MULTI) for model in ('gemma2-2b', 'gemma2-9b')]


def overrides(model: str, chips: int, slices: int) -> list[str]:
  """One sample per actor device per micro batch; at least the default 32
  prompts x 8 generations per step. FSDP inside a slice and as wide as the
  model's width divides (a dimension that does not divide its mesh axis is
  replicated: gemma3-27b's 5376 over 512 devices would be whole on each),
  data parallel over the rest (across slices: the outer axis, over DCN)."""
  # Several slices: every role on every chip (libtpu 0.0.42 dies with
  # SIGILL compiling a train step on 2 of 4 v5e-256 slices).
  layout = [] if slices == 1 else [
      '--config.meshes.layout=collocated', '--config.meshes.actor.devices=all',
      '--config.meshes.rollout.devices=all',
      '--config.meshes.rollout.axes=data=-1,tp=16']
  actor = chips * slices // (1 if layout else 2)
  samples = max(256, actor)
  fsdp = math.gcd(min(actor, chips), presets.PRESETS[model].embed_dim)
  axes = f'data={actor // fsdp},fsdp={fsdp}'
  return layout + [f'--config.meshes.actor.axes={axes}',
                   f'--config.meshes.reference.axes={axes}',
                   f'--config.rl.prompts_per_step={samples // 8}',
                   f'--config.rl.mini_batch_size={samples}',
                   f'--config.rl.micro_batch_size={actor}',
                   f'--config.rl.logps_micro_batch_size={actor}']


def run(model: str, tpu: str, slices: int, backend: str) -> dict:
  chips = topology.parse(tpu).chips
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, '-m', 'tunix_pw.main',
         f'--config=tunix_pw/configs/grpo.py:{model}',
         '--config.model.dtype=bfloat16',
         '--config.model.remat=full',
         *overrides(model, chips, slices),
         f'--compile_topology={tpu}', f'--compile_num_slices={slices}',
         f'--compile_backend={backend}', '--estimate',
         f'--workdir={workdir}'],
        cwd=ROOT, capture_output=True, text=True,
        env=dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=ROOT))
    wall = time.perf_counter() - start
    path = os.path.join(workdir, 'compile_report.json')
    if not os.path.exists(path):
      raise SystemExit(f'{model} on {slices} x {tpu} failed:\n'
                       f'{result.stderr[-3000:]}')
    with open(path) as f:
      report = json.load(f)
  worst = max(report['groups'], key=lambda g: g['peak'])
  estimate = report['estimate']
  longest = max(estimate['phases'],
                key=lambda p: p['seconds'] * p['per_step'])
  return dict(step_s=round(estimate['step']['seconds'], 2),
              tokens_per_s=round(estimate['step']['tokens_per_s']),
              mfu=round(estimate['step']['mfu'], 4),
              longest=f'{longest["name"]} ({longest["bound"]})',
              model=model, tpu=tpu, slices=slices, backend=backend,
              chips=report['chips'],
              peak_gib=round(report['peak_per_device'] / GIB, 2),
              hbm_gib=round(report['hbm_per_device'] / GIB, 2),
              roles=worst['roles'], largest_phase=worst['largest_phase'],
              fits=report['fits'],
              compile_s=round(report['compile_seconds'], 1),
              programs=sum(p['count'] for p in report['programs'].values()),
              wall_s=round(wall, 1))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--only', default='',
                      help='rows, comma-separated: a model, a TPU type, '
                      'model@tpu or a backend')
  only = [m for m in parser.parse_args().only.split(',') if m]
  rows = []
  print('| model | slices x TPU | backend | chips | peak HBM per device | '
        'worst devices (largest phase) | fits | programs | compile s | '
        'est. step s | est. tokens/s | est. MFU | longest phase (bound) |\n'
        '|' + ' --- |' * 13, flush=True)
  for model, tpu, slices, backend in ROWS:
    if only and not {model, tpu, f'{model}@{tpu}', backend} & set(only):
      continue
    row = run(model, tpu, slices, backend)
    rows.append(row)
    print(f'| {model} | {slices} x {tpu} | {backend} | {row["chips"]} | '
          f'{row["peak_gib"]} of {row["hbm_gib"]} GiB | '
          f'{"+".join(row["roles"])} ({row["largest_phase"]}) | '
          f'{"yes" if row["fits"] else "no"} | {row["programs"]} | '
          f'{row["compile_s"]} | {row["step_s"]} | '
          f'{row["tokens_per_s"]:,} | {row["mfu"]:.1%} | {row["longest"]} |',
          flush=True)
  print(json.dumps(dict(benchmark='compile_table', rows=rows)))


if __name__ == '__main__':
  main()
