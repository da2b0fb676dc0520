"""The fast tier: `pytest -m "not slow"` runs every test but those listed in
tests/slow.txt (README, Developing).

A test is slow when a full run measured it over `SLOW_OVER_S` (setup, call
and teardown together) or it needs the `trained_sft` model (a minute to
train, whichever test asks first), unless it is one of `PULSES`: a short job run per
job and per subsystem that only a run exercises, so that the fast tier
still imports every module and runs most of each one's lines. A new test
is fast until the list is made again from a full run's durations:

  python -m pytest --durations=0 > /tmp/full.log; python -m tests.tiers /tmp/full.log
"""

from __future__ import annotations

import collections
import os
import re
import sys

SLOW_OVER_S = 2.0
SLOW_LIST = os.path.join(os.path.dirname(__file__), 'slow.txt')
PULSES = (
    'tests/jobs/test_grpo.py::test_two_step_pulse[drgrpo-collocated]',
    'tests/jobs/test_distill.py::test_pulse[extra1]',
    'tests/jobs/test_trainers.py::test_two_step_pulse_on_fsdp4_tp2['
    '--config=tunix_pw/configs/sft.py:runlocal-extra0]',
    'tests/jobs/test_trainers.py::test_two_step_pulse_on_fsdp4_tp2['
    '--config=tunix_pw/configs/dpo.py:runlocal-extra4]',
    'tests/jobs/test_reward_model.py::'
    'test_the_job_trains_evaluates_and_exports',
    'tests/jobs/test_ppo.py::test_pulse_and_the_critic_learns[own mesh]',
    'tests/test_main.py::test_smoke_runs_then_resumes_on_new_meshes_but_not_'
    'a_new_model',
    'tests/jobs/test_agentic.py::test_the_code_task_runs_tests_in_the_sandbox',
    'tests/jobs/test_generate.py::test_generates_from_a_checkpoint_directory',
    'tests/test_compile_only.py::test_reward_model_plan_counts_its_value_model',
    'tests/runtime/test_reshard.py::test_cross_process_transfer_in_a_two_'
    'process_run',
    'tests/test_fuzz.py::test_random_overrides_exit_0_or_2_with_one_sentence['
    'demo:]',
    'tests/test_fuzz.py::test_random_overrides_exit_0_or_2_with_one_sentence['
    'eval:runlocal]',
)
_DURATION = re.compile(r'^([0-9.]+)s (?:call|setup|teardown)\s+(\S.*?)\s*$')


def slow(log: str) -> list[str]:
  """The node ids over SLOW_OVER_S in a `pytest --durations=0` log."""
  seconds = collections.Counter()
  for line in log.splitlines():
    if match := _DURATION.match(line):
      seconds[match[2]] += float(match[1])
  return sorted(n for n, s in seconds.items()
                if s > SLOW_OVER_S and not n.startswith(PULSES))


def listed() -> set[str]:
  with open(SLOW_LIST) as f:
    return {line.rstrip('\n') for line in f if line.strip()}


if __name__ == '__main__':
  with open(sys.argv[1]) as f:
    found = slow(f.read())
  with open(SLOW_LIST, 'w') as f:
    f.write(''.join(n + '\n' for n in found))
  print(f'{len(found)} slow tests written to {SLOW_LIST}')
