"""Every `python -m tunix_pw.main` (or `tunix-pw`) command in README.md,
docs/ and the config files' docstrings passes `--check_only` as written
(those that only print, such as `list` or `--print_config`, run): its placeholders (a Hugging Face checkpoint,
an earlier command's workdir, a dataset directory, a prompts file) become
fixtures (examples/tiny_checkpoint.py's model, a 1-step SFT run),
the JSONL datasets built from docs/data.md's own examples; a command
for a cluster checks on 8 virtual CPU devices."""

import ast
import functools
import importlib
import pathlib
import re
import shlex

import pytest

from tests import helpers
from examples import tiny_checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md')),
        ROOT / 'examples/README.md']
MODELS = ('checkpoint', 'rl.reward_model', 'rl.judge')  # fields, by suffix
OUTPUTS = ('export', 'output_dir', 'output_jsonl')
COMMAND = re.compile(r'tunix_pw\.main(?=\s|$)(.*)')
# The docs' commands also as the console script (docstrings give grammars).
DOC_COMMAND = re.compile(r'(?:tunix_pw\.main|^\s*tunix-pw)(?=\s|$)(.*)')
PRINTS = ('list', 'reference', '--print_config')  # run as written


def commands() -> list[tuple[str, list[str]]]:
  """(where, argv after `tunix_pw.main`) of every command in a sh block of
  the docs, and in the config files' docstrings; a command's leading
  PYTHONPATH (paths from the repository's root) is an argv entry of its
  own, `PYTHONPATH=...`."""
  found = []
  for doc in DOCS + sorted((ROOT / 'tunix_pw/configs').glob('*.py')):
    text = doc.read_text()
    markdown = doc.suffix == '.md'
    blocks = (re.findall(r'```sh\n(.*?)```', text, re.S) if markdown
              else [ast.get_docstring(ast.parse(text)) or ''])
    command = DOC_COMMAND if markdown else COMMAND
    lines = re.sub(r'\\\n\s*', ' ', '\n'.join(blocks)).splitlines()
    found += [(f'{doc.relative_to(ROOT)}:{i}',
               re.findall(r'^\s*(PYTHONPATH=\S+)', line) +
               shlex.split(m[1], comments=True))
              for i, line in enumerate(lines) if (m := command.search(line))]
  return found


def environment(argv: list[str]) -> tuple[list[str], dict[str, str]]:
  """argv without its PYTHONPATH entry, and that entry as the run's."""
  paths = [a.split('=', 1)[1] for a in argv if a.startswith('PYTHONPATH=')]
  env = {'PYTHONPATH': ':'.join([str(ROOT)] + [
      str(ROOT / p) for p in paths[0].split(':')])} if paths else {}
  return [a for a in argv if not a.startswith('PYTHONPATH=')], env


def jsonl_examples() -> dict[str, str]:
  """docs/data.md's example lines, by dataset name."""
  text = (ROOT / 'docs/data.md').read_text()
  return dict(re.findall(r'### `(\w+)`.*?```jsonl\n(.*?)```', text, re.S))


@functools.cache
def default_data(config_arg: str) -> str:
  path, _, arg = config_arg.partition(':')
  module = importlib.import_module(path[:-3].replace('/', '.'))
  config = module.get_config(arg) if arg else module.get_config()
  return config.get('data', {}).get('name', '')


@pytest.fixture(scope='module')
def fixtures(tmp_path_factory):
  root = tmp_path_factory.mktemp('placeholders')
  tiny_checkpoint.save(str(root / 'hf'))
  for name, lines in jsonl_examples().items():
    (root / name).mkdir()
    for split in ('train', 'test'):
      (root / name / f'{split}.jsonl').write_text(lines)
  (root / 'prompts.jsonl').write_text('{"prompt": "1+1="}\n')
  trained = helpers.run_main('--config=tunix_pw/configs/sft.py:runlocal',
                             '--config.steps=1', f'--workdir={root / "run"}')
  assert trained.returncode == 0, trained.stderr[-2000:]
  return root


def test_the_docs_show_commands_and_datasets():
  where = {w.split(':')[0] for w, _ in commands()}
  assert {'README.md', 'examples/README.md', 'docs/data.md', 'docs/sft.md',
          'docs/dpo.md', 'docs/distillation.md', 'docs/grpo.md',
          'docs/ppo.md', 'docs/models.md', 'docs/running.md',
          'docs/cluster.md', 'tunix_pw/configs/sft.py',
          'tunix_pw/configs/grpo.py'} <= where, where
  assert set(jsonl_examples()) == {'gsm8k', 'chat', 'preferences',
                                   'unpaired', 'code'}


def concrete(argv: list[str], fixtures: pathlib.Path,
             out: pathlib.Path) -> list[str]:
  """argv with its placeholders replaced by fixtures, and --check_only."""
  fields = dict(a[len('--config.'):].split('=', 1) for a in argv
                if a.startswith('--config.'))
  config = next(a.split('=', 1)[1] for a in argv if a.startswith('--config='))
  result = []
  for arg in argv:
    name, _, value = arg.partition('=')
    field = name[len('--config.'):]
    if field.endswith(MODELS) and value.startswith('/'):  # an earlier
      # command's workdir (/tmp/...), else a downloaded checkpoint; one
      # command's models share a tokenizer, so a workdir beside a
      # downloaded checkpoint was trained from one
      earlier = '/tmp/' in value and not any('=/ckpt/' in a for a in argv)
      arg = f'{name}={fixtures / ("run" if earlier else "hf")}'
    elif field == 'data.manual_dir':
      data = fields.get('data.name') or default_data(config)
      arg = f'{name}={fixtures / data}'
    elif field == 'prompts_file':
      arg = f'{name}={fixtures / "prompts.jsonl"}'
    elif field in OUTPUTS or name == '--workdir':
      arg = f'{name}={out / name.strip("-")}'
    result.append(arg)
  if 'runtime.host_device_count' not in fields:  # a pod's command, on 8
    result.append('--config.runtime.host_device_count=8')
  return result + ['--check_only']


@pytest.mark.slow  # a minute in all
@pytest.mark.parametrize('where, argv', commands(),
                         ids=[w for w, _ in commands()])
def test_a_documented_command_passes_check_only(where, argv, fixtures,
                                                tmp_path):
  argv, env = environment(argv)
  if set(argv) & set(PRINTS):
    result = helpers.run_main(*argv, **env)
    assert result.returncode == 0, (where, argv, result.stderr[-2000:])
    assert result.stdout.count('\n') > 10  # what it prints
    return
  result = helpers.run_main(*concrete(argv, fixtures, tmp_path), **env)
  assert result.returncode == 0, (where, argv, result.stderr[-2000:])
  assert 'check_only: the' in result.stdout
  assert not any(tmp_path.iterdir())  # nothing written
