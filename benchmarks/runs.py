"""Runs `python -m tunix_pw.main` in a fresh process from the repository
root, as a user would, for the benchmarks that chain jobs."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main_run(*args: str) -> str:
  """The job's stdout; a failed job ends the benchmark with its stderr."""
  result = subprocess.run([sys.executable, '-m', 'tunix_pw.main', *args],
                          cwd=ROOT, capture_output=True, text=True,
                          check=False)
  if result.returncode:
    sys.exit(f'{" ".join(args)} failed:\n{result.stderr[-3000:]}')
  return result.stdout


def demo_sft(workdir: str, seed: int, steps: int = 0) -> str:
  """The demo's SFT stage in `workdir` (stopped at 35% held-out accuracy,
  or, with `steps`, run that long: a strong model); returns its
  checkpoint directory."""
  main_run('--config=tunix_pw/configs/demo.py', "--config.stages=('sft',)",
           f'--workdir={workdir}', f'--config.sft.seed={seed}',
           *([f'--config.sft.steps={steps}', '--config.sft.stop_at_accuracy=0',
              '--config.sft.eval_every=500'] if steps else []))
  return os.path.join(workdir, 'sft')


def logged(workdir: str, key: str) -> list[dict]:
  """The records of a job's metrics.jsonl that hold `key`, in order."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [m for m in map(json.loads, f) if key in m]
