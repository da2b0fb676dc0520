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
  compilation_cache/   XLA's compiled programs, where launch/xpk.py puts them

A workdir is a local path or a `gs://` URL: the files here go through
`read_text` / `write_text` / `append_text` (etils.epath, gcsfs on GCS), the
checkpoints through Orbax (tensorstore), TensorBoard's events through
tensorboardX. Locally a file is replaced through a temporary file and a
rename (never torn); on GCS an object is replaced by one upload, atomic by
itself, and an append (GCS has none) uploads the object again whole.
"""

from __future__ import annotations

import json
import os
from typing import Any

from etils import epath

CONFIG = 'config.json'
CHECKPOINTS = 'checkpoints'
METRICS = 'metrics.jsonl'
TENSORBOARD = 'tensorboard'
SAMPLES = 'samples.jsonl'
PROFILE = 'profile'
GOODPUT = 'goodput.json'
COMPILE_REPORT = 'compile_report.json'
LAYOUT_PLAN = 'layout_plan.json'
PROGRESS = 'progress.png'
EVAL = 'eval.json'
SMOKE_SUMMARY = 'smoke_summary.json'
COMPILATION_CACHE = 'compilation_cache'


def data_report(process_index: int) -> str:
  return f'data_p{process_index}.json'


def smoke_checkpoint(process_index: int) -> str:
  return f'smoke_checkpoint_p{process_index}'


def path(workdir: str, *names: str) -> str:
  return os.path.join(workdir, *names)


def is_remote(name: str) -> bool:
  """An object-store URL (gs://...) rather than a local path."""
  return '://' in name


def exists(name: str) -> bool:
  return epath.Path(name).exists()


def read_text(name: str) -> str:
  return epath.Path(name).read_text()


def write_text(name: str, text: str) -> None:
  """Replaces the file `name` whole with `text`."""
  if is_remote(name):
    epath.Path(name).write_text(text)
    return
  with open(name + '.tmp', 'w') as f:
    f.write(text)
  os.replace(name + '.tmp', name)


def write_json(workdir: str, name: str, value: Any) -> None:
  """`value` as indented JSON into `workdir`'s file `name`, the directory
  made when missing."""
  epath.Path(workdir).mkdir(parents=True, exist_ok=True)
  write_text(path(workdir, name), json.dumps(value, indent=1))


def append_text(name: str, text: str) -> None:
  if is_remote(name):
    target = epath.Path(name)
    target.write_text((target.read_text() if target.exists() else '') + text)
    return
  with open(name, 'a') as f:
    f.write(text)


def is_trained(directory: str) -> bool:
  """A tunix_pw training workdir: its config snapshot and checkpoints."""
  return bool(directory) and epath.Path(
      path(directory, CHECKPOINTS)).is_dir() and exists(
          path(directory, CONFIG))
