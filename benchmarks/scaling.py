"""Scaling curves on this machine, written to a JSON and a PNG.

  sampler  new tokens/s of ours and Tunix's vanilla sampler (the small and
           large models of benchmarks/sampler.py, one device, tokens
           fetched, median of 5 interleaved calls) against the batch (1-64,
           64 new tokens) and against the new tokens (16-256, batch 4);
  grpo     our GRPO step (benchmarks/grpo_step.py, small workload, 4
           prompts) against the generations per prompt (2-16), by phase;
  reshard  seconds and peak memory growth of a cross-mesh weight transfer
           (benchmarks/reshard.py), ours and plain jax.device_put, against
           the tree size (~120 MB - 1.5 GB);
  compile  compile-only seconds of gemma2-2b GRPO at its real size
           (benchmarks/compile_table.py) against the chip count (v5p, 64 -
           2048 chips).
Each point of grpo, reshard and compile runs in a fresh process. A run of
some curves keeps the other curves' points in the JSON; the PNG draws all
of them. Prints one JSON line.

  python benchmarks/scaling.py [--curves=sampler,grpo,reshard,compile]
"""

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# Under the allocator jobs run under (both sides, where a peer runs too).
from tunix_pw.runtime import allocator  # pylint: disable=g-import-not-at-top,wrong-import-position
allocator.use_tcmalloc()

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import compile_table  # pylint: disable=g-import-not-at-top,wrong-import-position
import sampler as sampler_bench  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.models import checkpoints  # pylint: disable=g-import-not-at-top,wrong-import-position

HERE = os.path.dirname(os.path.abspath(__file__))
BATCHES, NEW_TOKENS = (1, 2, 4, 8, 16, 64), (16, 32, 64, 128, 256)
WORKLOADS = ('small', 'large')
GENERATIONS = (2, 4, 8, 16)
TREES = ((1, 4096), (2, 16384), (4, 16384), (8, 16384), (14, 16384))
TPUS = ('v5p-128', 'v5p-256', 'v5p-512', 'v5p-1024', 'v5p-2048', 'v5p-4096')


def child(script: str, *args: str) -> dict:
  """A benchmark script's JSON line, run in a fresh process."""
  out = subprocess.run([sys.executable, os.path.join(HERE, script), *args],
                       capture_output=True, text=True, check=False)
  if out.returncode:
    raise SystemExit(f'{script} {" ".join(args)} failed:\n'
                     f'{out.stderr[-3000:]}')
  return json.loads(out.stdout.strip().splitlines()[-1])


def sampler_curve() -> list[dict]:
  rows = []
  for workload in WORKLOADS:
    cfg = sampler_bench.model_config(workload)
    model = checkpoints.init(cfg, seed=0)
    points = [(b, 64) for b in BATCHES] + [(4, n) for n in NEW_TOKENS
                                           if n != 64]
    for batch, new in points:
      prompts = np.random.default_rng(0).integers(
          2, cfg.vocab_size, (batch, 32)).tolist()
      _, (ours, tunix) = sampler_bench.first_and_rates(
          batch * new, sampler_bench.ours(model, prompts, new),
          sampler_bench.tunix_peer(model, cfg, prompts, new))
      rows.append(dict(workload=workload, batch=batch, new_tokens=new,
                       tokens_per_s=round(ours, 1),
                       tunix_tokens_per_s=round(tunix, 1),
                       speedup=round(ours / tunix, 2)))
      print(rows[-1], file=sys.stderr, flush=True)
  return rows


def grpo_curve() -> list[dict]:
  rows = []
  for generations in GENERATIONS:
    run = child('grpo_step.py', '--side=ours', '--workloads=small',
                f'--generations={generations}')
    rows.append(dict(generations=generations, step_s=round(run['step_s'], 4),
                     phases_s={k: round(v, 4)
                               for k, v in run['phases_s'].items()}))
    print(rows[-1], file=sys.stderr, flush=True)
  return rows


def reshard_curve() -> list[dict]:
  rows = []
  for layers, vocab in TREES:
    run = child('reshard.py', '--repeats=3', f'--layers={layers}',
                f'--vocab={vocab}')
    rows.append(dict(
        tree_mb=run['tree_mb'], transfer_s=run['first_transfer_s'],
        rate_gb_s=run['rate_gb_s'], peak_growth_x_tree=run[
            'peak_growth_x_tree'],
        device_put_rate_gb_s=run['device_put']['rate_gb_s'],
        device_put_peak_growth_x_tree=run['device_put']['peak_growth_x_tree']))
    print(rows[-1], file=sys.stderr, flush=True)
  return rows


def compile_curve() -> list[dict]:
  rows = []
  for tpu in TPUS:
    run = compile_table.run('gemma2-2b', tpu, 1, compile_table.PATHWAYS)
    rows.append({k: run[k] for k in ('tpu', 'chips', 'compile_s', 'wall_s',
                                     'programs', 'peak_gib', 'fits')})
    print(rows[-1], file=sys.stderr, flush=True)
  return rows


CURVES = dict(sampler=sampler_curve, grpo=grpo_curve, reshard=reshard_curve,
              compile=compile_curve)


def plot(curves: dict, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
  (batch_ax, new_ax, grpo_ax), (rate_ax, peak_ax, compile_ax) = axes

  def lines(ax, rows, x, series, xlabel, ylabel, title, log=False):
    rows = sorted(rows, key=lambda r: r[x])
    for key, label in series:
      ax.plot([r[x] for r in rows], [r[key] for r in rows], 'o-',
              label=label)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.set_ylim(bottom=0)
    if log:
      ax.set_xscale('log', base=2)
    ax.grid(alpha=0.3)
    ax.legend()

  if 'sampler' in curves:
    for ax, x, fixed, label in ((batch_ax, 'batch', ('new_tokens', 64),
                                 'batch (64 new tokens)'),
                                (new_ax, 'new_tokens', ('batch', 4),
                                 'new tokens (batch 4)')):
      rows = [r for r in curves['sampler'] if r[fixed[0]] == fixed[1]]
      series = sorted({r['workload'] for r in rows})
      for workload in series:
        mine = sorted((r for r in rows if r['workload'] == workload),
                      key=lambda r: r[x])
        ax.plot([r[x] for r in mine], [r['speedup'] for r in mine], 'o-',
                label=f'{workload} model')
      ax.axhline(1.5, color='gray', ls='--', label='1.5x')
      ax.set(xlabel=label, ylabel='new tokens/s, tunix_pw / Tunix',
             title=f'sampler speedup against {x.replace("_", " ")}')
      ax.set_ylim(bottom=0)
      ax.set_xscale('log', base=2)
      ax.grid(alpha=0.3)
      ax.legend()
  if 'grpo' in curves:
    rows = curves['grpo']
    x = [r['generations'] for r in rows]
    bottom = np.zeros(len(rows))
    for phase in rows[0]['phases_s']:
      height = np.array([r['phases_s'][phase] for r in rows])
      grpo_ax.bar([str(g) for g in x], height, bottom=bottom, label=phase)
      bottom += height
    grpo_ax.plot([str(g) for g in x], [r['step_s'] for r in rows], 'ko-',
                 label='step')
    grpo_ax.set(xlabel='generations per prompt (4 prompts)',
                ylabel='seconds', title='GRPO step against generations')
    grpo_ax.legend()
  if 'reshard' in curves:
    rows = curves['reshard']
    lines(rate_ax, rows, 'tree_mb', (('rate_gb_s', 'reshard.transfer'),
                                     ('device_put_rate_gb_s', 'device_put')),
          'tree MB', 'GB/s', 'weight transfer rate against tree size')
    lines(peak_ax, rows, 'tree_mb',
          (('peak_growth_x_tree', 'reshard.transfer'),
           ('device_put_peak_growth_x_tree', 'device_put')),
          'tree MB', 'peak memory growth (x tree)',
          'transfer peak memory against tree size')
  if 'compile' in curves:
    lines(compile_ax, curves['compile'], 'chips',
          (('compile_s', 'compile'), ('wall_s', 'whole run')), 'v5p chips',
          'seconds', 'gemma2-2b GRPO compile-only against chips', log=True)
  fig.tight_layout()
  fig.savefig(path, dpi=80)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--curves', default=','.join(CURVES))
  parser.add_argument('--out', default=os.path.join(HERE, 'scaling'),
                      help='writes OUT.json and OUT.png')
  args = parser.parse_args()
  names = args.curves.split(',')
  if unknown := set(names) - set(CURVES):
    raise SystemExit(f'unknown curves {sorted(unknown)}: choose from '
                     f'{", ".join(CURVES)}.')
  curves = {}
  if os.path.exists(args.out + '.json'):
    with open(args.out + '.json') as f:
      curves = json.load(f)['curves']
  for name in names:
    curves[name] = CURVES[name]()
  result = dict(benchmark='scaling', curves=curves)
  with open(args.out + '.json', 'w') as f:
    json.dump(result, f, indent=1)
  plot(curves, args.out + '.png')
  print(json.dumps(result))


if __name__ == '__main__':
  main()
