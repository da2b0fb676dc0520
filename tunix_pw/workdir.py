"""A job's workdir, in one place: what is written where.

  config.json          the resolved config (a resume is checked against it)
  checkpoints/         Orbax checkpoints: train state and data position
  metrics.jsonl        one JSON object per logged step
  tensorboard/         TensorBoard event files (scalars, sample text)
  samples.jsonl        RL: prompts with their completions and rewards
  goodput.json         the run's goodput and where the rest of its time went
  profile/             a JAX profiler trace of --config.runtime.profile_steps
  compile_report.json  compile-only checks
  <stage>/             a pipeline's stages, each a workdir of its own
  progress.png         a pipeline's plot
  eval.json, smoke_summary.json, data_p<i>.json   those jobs' results
"""

from __future__ import annotations

import os

CONFIG = 'config.json'
CHECKPOINTS = 'checkpoints'
METRICS = 'metrics.jsonl'
TENSORBOARD = 'tensorboard'
SAMPLES = 'samples.jsonl'
PROFILE = 'profile'
GOODPUT = 'goodput.json'
COMPILE_REPORT = 'compile_report.json'
PROGRESS = 'progress.png'
EVAL = 'eval.json'
SMOKE_SUMMARY = 'smoke_summary.json'


def data_report(process_index: int) -> str:
  return f'data_p{process_index}.json'


def smoke_checkpoint(process_index: int) -> str:
  return f'smoke_checkpoint_p{process_index}'


def path(workdir: str, *names: str) -> str:
  return os.path.join(workdir, *names)


def is_trained(directory: str) -> bool:
  """A tunix_pw training workdir: its config snapshot and checkpoints."""
  return bool(directory) and os.path.isdir(
      path(directory, CHECKPOINTS)) and os.path.exists(
          path(directory, CONFIG))
