"""The compile-only plan holds every program a run compiles: for each job
and option, a two-step run of its runlocal config on the 8 CPU devices
(tests/compiled_programs.py lists what it compiled) against the programs of
the job's `compile_plan` lowered on the same role meshes. A program is its
function (name and source), its arguments' shapes and dtypes and their
placements."""

import json
import subprocess
import sys

import pytest

from tests import helpers

RUNLOCAL = 'tunix_pw/configs/{}.py:runlocal'
# Two steps and the final evaluation. Not in the plans yet, so left out
# here: an agent's turns (their prompt lengths follow the episodes), a
# reward model's and a judge's programs.
TWO_STEPS = ['--config.steps=2']


def compiled(tmp_path, *flags: str) -> dict[str, list]:
  out = tmp_path / 'programs.json'
  result = subprocess.run(
      [sys.executable, '-m', 'tests.compiled_programs', str(out), *flags,
       f'--workdir={tmp_path / "w"}'], env=helpers.env(), cwd=helpers.ROOT,
      capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(out.read_text())


CASES = {
    'sft with LoRA': ['sft', '--config.lora.rank=4'],
    'dpo': ['dpo'],
    'kto': ['dpo', '--config.dpo.algorithm=kto'],
    'reward model': ['reward_model'],
    'logit distillation': ['distill'],
    'on-policy distillation': ['grpo', '--config=' + RUNLOCAL.format(
        'grpo') + ',distill'],
    'grpo with decode chunks and pass@k': [
        'grpo', '--config.rl.decode_chunk=4', '--config.eval_k=2'],
    'ppo': ['ppo'],
}


@pytest.mark.parametrize('case', CASES)
def test_the_plan_holds_every_program_the_run_compiles(tmp_path, case):
  job, *flags = CASES[case]
  config = next((f for f in flags if f.startswith('--config=')),
                '--config=' + RUNLOCAL.format(job))
  flags = [f for f in flags if not f.startswith('--config=')]
  programs = compiled(tmp_path, config, *TWO_STEPS, *flags)
  planned = {json.dumps(p) for p in programs['plan']}
  missing = [p[:3] for p in programs['run'] if json.dumps(p) not in planned]
  assert programs['run'] and not missing, missing
