"""Wall time of the demo (the README's main command), end to end.

Runs `python -m tunix_pw.main --config=tunix_pw/configs/demo.py` in a fresh
process and workdir `--runs` times and prints one JSON line: the median wall
seconds (startup, SFT, GRPO, evaluations and plot included) and each run's
held-out accuracies after SFT and after GRPO: the demo's learning result,
which the test suite does not wait for (tests/jobs/test_demo.py cuts GRPO
to 10 steps).

  python benchmarks/demo.py [--runs=3] [--config.FIELD=VALUE ...]

(overrides go to the demo's command, e.g. another layout:
`--config.grpo.meshes.actor.axes=fsdp=2,stage=2`).

Targets: median wall time at most 180 s on this 2-core machine; SFT stops
between 20% and 70% held out, GRPO raises that by at least 10 points.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_once(overrides: list[str]) -> dict[str, float]:
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, '-m', 'tunix_pw.main',
         '--config=tunix_pw/configs/demo.py', f'--workdir={workdir}',
         *overrides],
        cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
  if result.returncode:
    sys.exit(f'the demo failed:\n{result.stderr[-3000:]}')
  accuracy = dict(re.findall(
      r'pipeline: after (\w+): held-out accuracy ([\d.]+)%', result.stdout))
  return dict(wall_s=round(seconds, 1), sft_accuracy=float(accuracy['sft']),
              grpo_accuracy=float(accuracy['grpo']))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--runs', type=int, default=3)
  args, overrides = parser.parse_known_args()
  runs = [run_once(overrides) for _ in range(args.runs)]
  print(json.dumps(dict(
      benchmark='demo', overrides=overrides,
      median_wall_s=statistics.median(r['wall_s'] for r in runs), runs=runs,
      median_gain_points=statistics.median(
          r['grpo_accuracy'] - r['sft_accuracy'] for r in runs),
      target_wall_s=180, target_sft_accuracy=[20, 70],
      target_gain_points=10)))


if __name__ == '__main__':
  main()
