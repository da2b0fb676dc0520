"""The config reference: every field has help, docs/reference.md is what
its generator prints, and `list` / `--print_config` work through main."""

import pathlib

from absl import flags

from tests import helpers
from tunix_pw import main
from tunix_pw.configs import reference

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_field_of_every_job_has_help_and_every_help_a_field():
  keys, missing = set(), set()
  for path, arg, config in reference.configs():
    for field in reference.fields(config):
      keys.add(field.key)
      if not reference.help_for(field):
        missing.add(f'{path}:{arg} {field.path}')
  assert not missing, sorted(missing)
  stale = [k for k in reference.HELP if k.split(':')[-1] not in keys]
  assert not stale, stale


def test_every_config_file_is_a_listed_job():
  files = {p.stem for p in (ROOT / 'tunix_pw/configs').glob('*.py')}
  assert files - {'__init__', 'common', 'field_help', 'reference'} == set(
      reference.JOBS)


def test_the_reference_page_is_what_the_generator_prints():
  page = (ROOT / 'docs/reference.md').read_text()
  assert page == reference.reference(main._command_line(),
                                     main._exit_codes()), (
      'docs/reference.md is stale: tunix-pw reference > docs/reference.md')
  defined = {f.name for f in flags.FLAGS.get_flags_for_module(main)}
  assert {f.name for f in main._FLAGS} == defined  # every flag of main


def test_list_reference_and_print_config_through_main():
  listed = helpers.run_main('list')
  assert listed.returncode == 0, listed.stderr
  for name, (grammar, _, _) in reference.JOBS.items():
    assert f'{name}.py' in listed.stdout and grammar in listed.stdout
  printed = helpers.run_main('reference')
  assert printed.returncode == 0, printed.stderr
  assert printed.stdout == (ROOT / 'docs/reference.md').read_text()
  shown = helpers.run_main('--config=tunix_pw/configs/demo.py',
                           '--config.grpo.rl.temperature=0.7',
                           '--print_config')
  assert shown.returncode == 0, shown.stderr
  lines = shown.stdout.splitlines()
  at = lines.index('grpo.rl.temperature = 0.7')
  assert 'tempered policy' in lines[at + 1]  # its help, under it
  assert 'sft.stop_at_accuracy = 0.35' in lines
