"""Every job through `main`: metrics (timings aside) and exported final
parameters bit-identical to goldens. GRPO and its variants (5 steps) were
recorded before the RL loop was rebuilt from phases, before the non-finite
step guard and before the asynchronous rollouts; the other jobs' (a few
steps each) before the upper floors' redesign (`python -m
tests.jobs.test_golden [CASE ...] [--kind=NAME]` records them anew, for a
deliberate change of results). Asynchronous rollouts have none: which
weights a rollout is generated with follows the threads' timing.

XLA compiles CPU code for the processor it runs on, and its float rounding
differs between processor kinds (the machine the goldens were first
recorded on and an AMD EPYC gave last-bit differences from the first update
on, for the same code; an AMD EPYC without AVX-512, `amd_epyc_avx2`, from
another): each kind has its goldens (`goldens/<kind>/`, the first kind's
at the top), and a run must equal one of them bit for bit."""

import hashlib
import json
import operator
import os
import sys

import pytest

from tests import helpers
from tunix_pw.train import metrics

GOLDENS = os.path.join(os.path.dirname(__file__), 'goldens')
VARIANTS = ('grpo', 'dapo', 'drgrpo', 'gspo')
GRPO = [
    '--config.steps=5', '--config.log_every=1', '--config.eval_examples=50',
    # Partial credit: a random model's groups differ, so every step learns.
    '--config.rl.rewards=digits:1.0,format:0.1,overlong:0.5',
    # Two updates per rollout (importance ratios, old log-probabilities).
    '--config.rl.mini_batch_size=32',
    # The train step as recorded: scanned layers (unrolled, as on CPU by
    # default, its backward rounds differently; test_step checks the two
    # agree).
    '--config.model.unroll_cpu_train=False']
SHORT = ['--config.steps=3', '--config.log_every=1']
RL = ['--config.steps=2', '--config.log_every=1', '--config.eval_examples=8',
      '--config.rl.rewards=digits:1.0,format:0.1,overlong:0.5']
CASES = {
    **{v: [f'--config=tunix_pw/configs/grpo.py:runlocal,{v}', *GRPO]
       for v in VARIANTS},
    'sft': ['--config=tunix_pw/configs/sft.py:runlocal', *SHORT,
            '--config.eval_examples=8'],
    'sft_lora': ['--config=tunix_pw/configs/sft.py:runlocal', *SHORT,
                 '--config.eval_examples=8', '--config.lora.rank=4'],
    'dpo': ['--config=tunix_pw/configs/dpo.py:runlocal', *SHORT],
    'orpo': ['--config=tunix_pw/configs/dpo.py:runlocal', *SHORT,
             '--config.dpo.algorithm=orpo'],
    'kto': ['--config=tunix_pw/configs/dpo.py:runlocal', *SHORT,
            '--config.dpo.algorithm=kto'],
    'reward_model': ['--config=tunix_pw/configs/reward_model.py:runlocal',
                     *SHORT],
    'distill': ['--config=tunix_pw/configs/distill.py:runlocal', *SHORT,
                '--config.eval_examples=8'],
    'on_policy_distill': [
        '--config=tunix_pw/configs/grpo.py:runlocal,distill', *RL],
    'ppo': ['--config=tunix_pw/configs/ppo.py:runlocal', *RL],
    'agentic': ['--config=tunix_pw/configs/agentic.py:runlocal',
                '--config.sft.steps=3', '--config.sft.eval_examples=8',
                '--config.sft.eval_every=3', *helpers.AGENTIC_SMALL,
                '--config.agentic.log_every=1',
                # Turns batched in lockstep: concurrent episodes' batches
                # follow the tools' timing.
                '--config.agentic.agent.lockstep=true'],
}
# Timings, and what timing decides (the rollout queue's depth when a step
# starts).
TIMINGS = ('time/', 'rollout_tokens_per_s', 'tokens_per_s', 'step_time',
           'step_seconds', 'compilations', 'queue_depth')


def run(case: str, workdir: str) -> dict:
  """The run's metrics.jsonl without timings, and a digest of its exported
  final parameters (a pipeline's: its last stage's)."""
  flags = CASES[case]
  stage = 'agentic.' if case == 'agentic' else ''
  export = os.path.join(workdir, 'export')
  result = helpers.run_main(*flags, f'--config.{stage}export={export}',
                            f'--workdir={workdir}')
  assert result.returncode == 0, result.stderr[-3000:]
  with open(os.path.join(export, 'model.safetensors'), 'rb') as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  logged = [{k: v for k, v in m.items() if not k.startswith(TIMINGS)}
            for m in metrics.read(os.path.join(workdir, stage[:-1]))]
  return dict(metrics=logged, params_sha256=digest)


def goldens(case: str) -> list[dict]:
  """The case's goldens, one per processor kind recorded."""
  paths = [os.path.join(GOLDENS, f'{case}.json')] + [
      os.path.join(GOLDENS, kind, f'{case}.json')
      for kind in sorted(os.listdir(GOLDENS))
      if os.path.isdir(os.path.join(GOLDENS, kind))]
  out = []
  for path in filter(os.path.exists, paths):
    with open(path) as f:
      out.append(json.load(f))
  return out


def recorded(got: dict, golden: dict) -> tuple[list, list]:
  """Every value the golden recorded, from the run and from the golden
  (metrics added since, such as `skipped`, aside)."""
  want = [{k: v for k, v in m.items() if not k.startswith(TIMINGS)}
          for m in golden['metrics']]
  return [{k: m.get(k) for k in w} for m, w in zip(got['metrics'], want)], want


@pytest.mark.parametrize('case', CASES)
def test_bit_identical_to_goldens(tmp_path, case):
  got = run(case, str(tmp_path))
  candidates = goldens(case)
  # A processor kind's golden, matched in full: kinds can share parameters
  # and differ in a logged metric's last bit.
  if any(operator.eq(*recorded(got, g))
         and len(got['metrics']) == len(g['metrics'])
         and got['params_sha256'] == g['params_sha256'] for g in candidates):
    return
  # None matches: show the change against the kind with these parameters
  # (or the first).
  golden = next((g for g in candidates
                 if g['params_sha256'] == got['params_sha256']), candidates[0])
  values, want = recorded(got, golden)
  assert values == want
  assert len(got['metrics']) == len(golden['metrics'])
  assert got['params_sha256'] == golden['params_sha256']


if __name__ == '__main__':
  import tempfile  # pylint: disable=g-import-not-at-top
  # The suite's environment (CPU, TCMalloc preloaded): without it each run
  # re-executed itself under TCMalloc as the fork server, and did nothing.
  from tests import conftest  # pylint: disable=g-import-not-at-top,unused-import
  # --kind=NAME records into goldens/NAME/ (a new processor kind).
  kind = next((a.split('=', 1)[1] for a in sys.argv[1:]
               if a.startswith('--kind=')), '')
  os.makedirs(os.path.join(GOLDENS, kind), exist_ok=True)
  for name in [a for a in sys.argv[1:] if not a.startswith('--')] or CASES:
    with tempfile.TemporaryDirectory() as tmp:
      with open(os.path.join(GOLDENS, kind, f'{name}.json'), 'w') as f:
        json.dump(run(name, tmp), f, indent=1)
    print('recorded', name)
