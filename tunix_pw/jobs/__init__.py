"""Jobs by name.

A job is a module with `validate(config)` (static checks, no devices) and
`run(config, runtime, meshes, workdir)` (one explicit loop). `config.job`
picks it; modules are imported only when chosen.
"""

from __future__ import annotations

import importlib
import types

from tunix_pw.errors import UsageError

_JOBS = {
    'agentic': 'tunix_pw.jobs.agentic',
    'data': 'tunix_pw.jobs.data',
    'distill': 'tunix_pw.jobs.distill',
    'dpo': 'tunix_pw.jobs.dpo',
    'eval': 'tunix_pw.jobs.eval',
    'generate': 'tunix_pw.jobs.generate',
    'grpo': 'tunix_pw.jobs.grpo',
    'pairs': 'tunix_pw.jobs.pairs',
    'pipeline': 'tunix_pw.jobs.pipeline',
    'ppo': 'tunix_pw.jobs.ppo',
    'reward_model': 'tunix_pw.jobs.reward_model',
    'sft': 'tunix_pw.jobs.sft',
    'smoke': 'tunix_pw.jobs.smoke',
}


def get(name: str) -> types.ModuleType:
  if name not in _JOBS:
    raise UsageError(f'--config.job={name!r} is unknown; use one of '
                     f'{", ".join(sorted(_JOBS))}.')
  return importlib.import_module(_JOBS[name])
