"""The config reference: every field's help, the jobs and their arguments.

  tunix-pw list                            # the jobs, their config files
  tunix-pw --config=FILE.py:ARG --print_config [--config.x=y ...]
  tunix-pw reference > docs/reference.md   # with main's flags

A field's help is looked up by its path with the block it belongs to
normalised: `teacher.*` and `critic.model.*` are model blocks,
`critic.optimizer.*` an optimizer block, `meshes.<role>.*` a role,
`mixture.<name>.data.*` a data block; a pipeline's stage (`sft.*` in the
demo) is its job's config. `job:field` entries say what a field means
in one job where that differs from its common meaning.
"""

from __future__ import annotations

import importlib
import textwrap
from typing import Any, Iterator, NamedTuple

import ml_collections

from tunix_pw.configs.field_help import HELP

# job -> (argument grammar, what it does, the args whose configs hold
# every field the job can have)
JOBS = {
    'sft': ('<preset|runlocal>', 'supervised fine-tuning, full or LoRA/QLoRA',
            ('runlocal', 'gemma2-2b')),
    'dpo': ('<preset|runlocal>', 'DPO, IPO, ORPO or KTO on preference data',
            ('runlocal', 'gemma2-2b')),
    'distill': ('<preset|runlocal>', 'logit, attention or feature '
                'distillation from a frozen teacher', ('runlocal',)),
    'grpo': ('<preset|runlocal>[,<variant>[,mix]]', 'the GRPO family (grpo, '
             'dapo, drgrpo, gspo, cispo, reinforce++, distill), async',
             ('runlocal', 'runlocal,distill', 'runlocal,grpo,mix')),
    'ppo': ('<preset|runlocal>', 'PPO with a critic (GAE)', ('runlocal',)),
    'agentic': ('<preset|runlocal>[,<qwen|llama|gemma>][,code] | '
                'runlocal,retry', 'multi-turn RL with tools and the code '
                'sandbox', ('runlocal', 'runlocal,retry', 'qwen3-1.7b,code')),
    'reward_model': ('<preset|runlocal>', 'a reward model from preference '
                     'pairs (Bradley-Terry)', ('runlocal',)),
    'pairs': ('<preset|runlocal>', "preference pairs from a model's own "
              'samples', ('runlocal',)),
    'eval': ('<preset|runlocal>', 'held-out exact match or loss of a model',
             ('runlocal',)),
    'generate': ('<preset|runlocal>', 'sample a model on some prompts',
                 ('runlocal',)),
    'demo': ('[grpo|ppo]', 'SFT then GRPO (or PPO) on 2-digit additions, '
             'on 8 virtual CPU devices', ('grpo', 'ppo')),
    'data': ('<arithmetic|gsm8k|preferences|chat|code>', "read a dataset "
             "through its pipeline once", ('arithmetic',)),
    'smoke': ('[disaggregated|collocated]', 'a sharded loop and a weight '
              'transfer: the runtime end to end', ('disaggregated',)),
}

_MODEL = 'model (also teacher, critic.model)'
_OPTIMIZER = 'optimizer (also critic.optimizer)'



def _scope(path: str) -> str:
  """A path with its block normalised (the module docstring)."""
  parts = path.split('.')
  if parts[0] == 'teacher':
    parts[0] = 'model'
  elif parts[:2] in (['critic', 'model'], ['critic', 'optimizer']):
    parts = parts[1:]
  elif parts[0] == 'meshes' and len(parts) == 3:
    parts[1] = 'ROLE'
  elif parts[0] == 'mixture' and len(parts) > 2:
    parts = parts[2:] if parts[2] == 'data' else ['mixture', 'NAME', *parts[2:]]
  return '.'.join(parts)


class Field(NamedTuple):
  job: str  # the job (a pipeline stage's own) the field belongs to
  path: str  # where it is in the config
  key: str  # its help's key: the path in its job, block normalised
  value: Any


def fields(config: ml_collections.ConfigDict,
           prefix: str = '') -> Iterator[Field]:
  """Every leaf; a pipeline's stages under their names, each with its own
  job."""
  job = config.get('job', '')
  for name, value in config.items():
    path = f'{prefix}{name}'
    if isinstance(value, ml_collections.ConfigDict) and 'job' in value:
      yield from (f._replace(path=f'{path}.{f.path}') for f in fields(value))
    elif isinstance(value, ml_collections.ConfigDict):
      yield from (f._replace(job=job) for f in fields(value, f'{path}.'))
    else:
      yield Field(job, path, _scope(path), value)


def help_for(field: Field) -> str | None:
  return HELP.get(f'{field.job}:{field.key}', HELP.get(field.key))


def print_config(config: ml_collections.ConfigDict) -> str:
  """The resolved config, each field with its help."""
  lines = []
  for field in fields(config):
    lines.append(f'{field.path} = {field.value!r}')
    lines += textwrap.wrap(help_for(field) or '', 76,
                           initial_indent='    ', subsequent_indent='    ')
  return '\n'.join(lines)


def configs() -> Iterator[tuple[str, str, ml_collections.ConfigDict]]:
  """(config file, arg, config) of every job's covering args."""
  for name, (_, _, args) in JOBS.items():
    module = importlib.import_module(f'tunix_pw.configs.{name}')
    for arg in args:
      yield f'tunix_pw/configs/{name}.py', arg, module.get_config(arg)


def jobs_table() -> str:
  """`tunix-pw list`."""
  lines = ['Run: tunix-pw --config=tunix_pw/configs/<file>.py:<arg> '
           '[--config.x=y ...] --workdir=DIR', '']
  for name, (grammar, what, _) in JOBS.items():
    lines.append(f'{name + ".py":<16} {what}')
    lines.append(f'{"":<16} arg: {grammar}')
  return '\n'.join(lines)


def reference(command_line: list[tuple[str, Any, str]],
              exit_codes: str) -> str:
  """docs/reference.md: main's flags (name, default, help) and exit codes,
  then every config field, by block, with its help and the jobs that have
  it."""
  jobs: dict[str, set[str]] = {}
  for _, _, config in configs():
    for field in fields(config):
      jobs.setdefault(field.key, set()).add(field.job)
  cell = lambda text: text.replace('|', '\\|')
  out = ['# Reference', '',
         'Generated by `tunix-pw reference` from the command line and the '
         'configs (CI checks that this page matches). A run prints its own '
         'resolved config, defaults and overrides included, with '
         '`--print_config`; `tunix-pw list` lists the config files.', '',
         '## Command line', '',
         '`tunix-pw` (or `python -m tunix_pw.main`) takes `list`, '
         '`reference`, or these flags; `--config.<field>=<value>` sets any '
         'field below.', '', '| Flag | Default | Help |', '|---|---|---|']
  out += [f'| `--{name}` | `{default!r}` | {cell(text)} |'
          for name, default, text in command_line]
  out += ['', '## Exit codes', '', exit_codes, '',
          '## Jobs', '', '| Config file | Argument | What it does |',
          '|---|---|---|']
  out += [f'| `tunix_pw/configs/{name}.py` | `{cell(grammar)}` | {what} |'
          for name, (grammar, what, _) in JOBS.items()]
  blocks: dict[str, list[str]] = {'': []}
  for key in sorted(jobs):
    block = key.split('.')[0] if '.' in key else ''
    blocks.setdefault(block, []).append(key)
  titles = {'': 'Top-level fields', 'model': _MODEL,
            'optimizer': _OPTIMIZER}
  for block, keys in blocks.items():
    out += ['', f'## {titles.get(block, block)}', '',
            '| Field | Jobs | Help |', '|---|---|---|']
    for key in keys:
      overrides = [j for j in sorted(jobs[key]) if f'{j}:{key}' in HELP]
      text = HELP.get(key, '')
      text += ''.join(f' {j}: {HELP[f"{j}:{key}"]}' for j in overrides)
      out.append(f'| `{key}` | {", ".join(sorted(jobs[key]))} | '
                 f'{cell(text.strip())} |')
  return '\n'.join(out) + '\n'
