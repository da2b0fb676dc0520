"""Asynchronous RL against synchronous, with a slow verifier.

The GRPO job of `grpo.py:runlocal` (tiny Gemma, 8 prompts x 8 generations,
actor on devices 0-3 and the rollout engine on 4-7) runs through main in
this process. Its synchronous step's compute C is measured first; then a
verifier latency L per step (a reward that sleeps L / samples per sample,
like a sandbox or a remote judge) is added for L/C in 0.25, 0.5, 1, 2, and
each runs synchronously (max_staleness=0) and asynchronously (1). On this
machine both sides share 2 CPU cores, so only the verifier's latency can
overlap the compute: the ideal speedup is (C + L) / max(C, L). Prints one
JSON line; steps/s are medians of steps 4 to --steps.

  python benchmarks/async_rl.py [--steps=14]
  python benchmarks/async_rl.py --part=demo

Target: at L = C, async at least 1.6x sync. `--part=demo` runs the Quick
start demo (SFT, then 200 GRPO steps) synchronously, with max_staleness=1,
and with max_staleness=1 and truncated importance weights (tis_cap=2), same
seeds, and prints each one's held-out accuracy gain over the SFT start
(target: async within 3 points of sync).
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# Under the allocator jobs run under (both sides, where a peer runs too).
from tunix_pw.runtime import allocator  # pylint: disable=g-import-not-at-top,wrong-import-position
allocator.use_tcmalloc()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_num_cpu_devices', 8)

from in_process import run_main  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.rl import rewards  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.registry import register  # pylint: disable=g-import-not-at-top,wrong-import-position

SAMPLES = 8 * 8  # runlocal: prompts_per_step x num_generations
latency = [0.0]  # seconds per step, read by the verifier


@register('reward', 'slow_verifier')
def slow_verifier(sample):
  time.sleep(latency[0] / SAMPLES)
  return rewards.exact_answer(sample)


def run(staleness: int, seconds: float, steps: int) -> None:
  """One job in this process (main's flags are defined once per process):
  prints its median seconds per step."""
  latency[0] = seconds
  work = tempfile.mkdtemp()
  logged = [m for m in run_main([
      '--config=tunix_pw/configs/grpo.py:runlocal',
      '--config.rl.rewards=slow_verifier:1.0,format:0.1',
      f'--config.rl.max_staleness={staleness}', f'--config.steps={steps}',
      '--config.eval_examples=0', '--config.checkpoint.every=0',
      f'--workdir={work}'], work) if 'loss' in m][3:]  # past compilation
  print('seconds_per_step', statistics.median(m['time/step'] for m in logged))


def seconds_per_step(staleness: int, seconds: float, steps: int) -> float:
  out = subprocess.run(
      [sys.executable, __file__, f'--one={staleness},{seconds}',
       f'--steps={steps}'], check=True, capture_output=True, text=True).stdout
  return float(out.split('seconds_per_step ')[-1])


def demo_gains() -> dict[str, float]:
  """The demo's GRPO gain in held-out accuracy points, per setting."""
  gains = {}
  ahead = '--config.grpo.rl.max_staleness=1'
  for name, flags in (('sync', []), ('async', [ahead]),
                      ('async_tis', [ahead, '--config.grpo.rl.tis_cap=2'])):
    out = subprocess.run(
        [sys.executable, '-m', 'tunix_pw.main',
         '--config=tunix_pw/configs/demo.py', *flags,
         f'--workdir={tempfile.mkdtemp()}'], check=True, capture_output=True,
        text=True).stdout
    accuracy = dict(re.findall(
        r'pipeline: after (\w+): held-out accuracy ([\d.]+)%', out))
    gains[name] = round(float(accuracy['grpo']) - float(accuracy['sft']), 1)
  return gains


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--steps', type=int, default=14)
  parser.add_argument('--part', default='latency', choices=('latency', 'demo'))
  parser.add_argument('--one', default='')  # staleness,latency: one run
  args = parser.parse_args()
  if args.part == 'demo':
    print(json.dumps(dict(benchmark='async_rl_demo', gain_points=demo_gains(),
                          target='async within 3 points of sync')))
    return
  if args.one:
    staleness, seconds = args.one.split(',')
    run(int(staleness), float(seconds), args.steps)
    return
  compute = seconds_per_step(0, 0.0, args.steps)
  rows = []
  for ratio in (0.25, 0.5, 1.0, 2.0):
    sync, overlapped = (seconds_per_step(k, ratio * compute, args.steps)
                        for k in (0, 1))
    rows.append(dict(
        latency_over_compute=ratio, sync_steps_per_s=round(1 / sync, 3),
        async_steps_per_s=round(1 / overlapped, 3),
        speedup=round(sync / overlapped, 3),
        ideal=round((1 + ratio) / max(1.0, ratio), 3)))
  print(json.dumps(dict(benchmark='async_rl', compute_s=round(compute, 4),
                        rows=rows, target=dict(speedup_at_1=1.6))))


if __name__ == '__main__':
  main()
