"""Jobs by name.

A job is a module with `validate(config)` (static checks, no devices) and
`run(config, runtime, meshes, workdir)` (one explicit loop). `config.job`
picks it; the registry holds each job's module path, and a module is
imported only when chosen.
"""

from __future__ import annotations

import importlib
import types

from tunix_pw import registry

for _name in ('agentic', 'data', 'distill', 'dpo', 'eval', 'generate', 'grpo',
              'pairs', 'pipeline', 'ppo', 'reward_model', 'sft', 'smoke'):
  registry.register('job', _name)(f'tunix_pw.jobs.{_name}')


def get(name: str) -> types.ModuleType:
  registry.check('job', name, '--config.job')
  return importlib.import_module(registry.get('job', name))
