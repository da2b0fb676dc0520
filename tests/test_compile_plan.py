"""The compile-only plan holds every program a run compiles: for each job
and option, a two-step run of its runlocal config on the 8 CPU devices
(tests/compiled_programs.py lists what it compiled) against the programs of
the job's `compile_plan` lowered on the same role meshes. A program is its
function (name and source), its arguments' shapes and dtypes and their
placements."""

import json
import re
import subprocess
import sys

import pytest

from tests import helpers
from tests.jobs.test_reward_model import random_reward_model  # pylint: disable=unused-import

RUNLOCAL = 'tunix_pw/configs/{}.py:runlocal'
TWO_STEPS = ['--config.steps=2']  # and the final evaluation


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
    # The warm-up's SFT steps and held-out episodes, then agentic steps.
    'agentic': ['agentic', '--config.sft.steps=2',
                '--config.sft.eval_examples=8', '--config.sft.eval_every=2',
                *helpers.AGENTIC_SMALL],
}


@pytest.mark.parametrize('case', CASES)
def test_the_plan_holds_every_program_the_run_compiles(tmp_path, case):
  job, *flags = CASES[case]
  config = next((f for f in flags if f.startswith('--config=')),
                '--config=' + RUNLOCAL.format(job))
  flags = [f for f in flags if not f.startswith('--config=')]
  if not any('.steps=' in f for f in flags):
    flags += TWO_STEPS
  _check(compiled(tmp_path, config, *flags))


def test_the_plan_holds_the_reward_models_and_the_judges_programs(
    tmp_path, random_reward_model, trained_sft):  # pylint: disable=redefined-outer-name
  _, reward_model = random_reward_model
  _, judge = trained_sft
  programs = compiled(
      tmp_path, '--config=' + RUNLOCAL.format('grpo'), *TWO_STEPS,
      '--config.rl.rewards=reward_model:1,judge:1',
      f'--config.rl.reward_model={reward_model}', f'--config.rl.judge={judge}')
  _check(programs)


def _check(programs: dict[str, list]) -> None:
  missing = [p[:3] for p in programs['run']
             if not any(_holds(q, p) for q in programs['plan'])]
  assert programs['run'] and not missing, missing


def _holds(planned: list, ran: list) -> bool:
  """Whether a program of the plan is the one the run compiled: equal, or
  (a bounded phase's) the same function, operations and placements at
  shapes at least as large."""
  if planned[:2] != ran[:2] or planned[3] != ran[3] or planned[5] != ran[5]:
    return False
  return planned[2] == ran[2] or planned[4] and len(ran[2]) == len(
      planned[2]) and all(map(_within, ran[2], planned[2]))


def _within(ran: str, planned: str) -> bool:
  """'int32[8,16]' within 'int32[64,16]': the same dtype and rank, no
  dimension larger."""
  (r_type, r_dims, r_rest), (p_type, p_dims, p_rest) = (
      re.fullmatch(r'(.+?)\[([\d,]*)\](.*)', a).groups()
      for a in (ran, planned))
  r_dims, p_dims = r_dims.split(','), p_dims.split(',')
  return (r_type, r_rest) == (p_type, p_rest) and len(r_dims) == len(
      p_dims) and all(int(r or 0) <= int(p or 0)
                      for r, p in zip(r_dims, p_dims))
