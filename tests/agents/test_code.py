"""The code task: tests run in the sandbox, reward = the fraction passed;
code that cheats passes nothing; self-correction shows the failing test."""

import asyncio
from collections import Counter
import concurrent.futures
import json
import shutil

import pytest

from tunix_pw import sandbox
from tunix_pw.agents import envs, episodes
from tunix_pw.configs import agentic
from tunix_pw.errors import InfrastructureError
from tunix_pw.jobs import agentic as agentic_job
from tunix_pw.models import tokenizers

pytestmark = pytest.mark.skipif(
    shutil.which('bwrap') is None,
    reason='bubblewrap is not installed (.ci/run installs it)')

EXAMPLE = dict(
    question='Write f(x) returning 3*x+1.', answer='def f(x):\n  return 3*x+1',
    tests=json.dumps([dict(call='f(0)', expected='1'),
                      dict(call='f(2)', expected='7'),
                      dict(call='f(-1)', expected='-2')]))


@pytest.fixture(scope='module')
def pool():
  with concurrent.futures.ThreadPoolExecutor(4) as executor:
    yield executor


def answer(code, pool, attempts=1):
  config = agentic.agent_block('gemma')
  config.update(env='code', tools='', tool_timeout=4.0, attempts=attempts,
                feedback='Failed: {feedback}')
  task = envs.task(config, tokenizers.CharTokenizer(), pool)
  env = task.new()
  env.reset(EXAMPLE)
  return task, env, asyncio.run(env.step(code))


@pytest.mark.parametrize('code,passed,feedback', [
    ('```python\ndef f(x):\n  return 3*x+1\n```', 3, ''),
    ('Here:\n```python\ndef f(x):\n  return 3*x+1 if x >= 0 else 0\n```', 2,
     'f(-1) should be -2, got 0'),
    ('def f(x):\n  return x', 0, 'f(0) should be 1, got 0'),
    ('def f(x) return 1', 0, 'f(0) should be 1, got SyntaxError'),
])
def test_reward_is_the_fraction_of_tests_passed(code, passed, feedback, pool):
  _, _, step = answer(code, pool)
  assert step.done and step.reward == pytest.approx(passed / 3)
  assert step.solved == (passed == 3)  # the verdict: every test passed
  assert step.info['tests_passed'] == passed and step.info['tests'] == 3
  assert step.feedback.startswith(feedback)


@pytest.mark.parametrize('code', [
    'import sys\nprint("7")\nsys.exit(0)',  # print an answer, skip the call
    'import os\nprint("1"); print("7"); print("-2")\nos._exit(0)',
    'import builtins\nbuiltins.print = lambda *a: None\ndef f(x): return 1',
    'while True: pass',  # killed at its limit: the run goes on
])
def test_code_that_cheats_or_hangs_passes_nothing(code, pool):
  _, _, step = answer(code, pool)
  assert step.reward == 0.0 and step.done


def test_hanging_code_is_counted():
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    _, _, step = answer('while True: pass', pool)
  assert step.info['sandbox_limits'] == 3
  assert step.feedback == 'f(0) should be 1, got killed at a limit'


def test_self_correction_shows_the_failing_test(pool):
  tok = tokenizers.CharTokenizer()
  config = agentic.agent_block('gemma')
  config.update(env='code', tools='', tool_timeout=4.0, attempts=2,
                max_turns=2, feedback='Failed: {feedback}')
  collector = episodes.Collector(None, envs.task(config, tok, pool), tok,
                                 config, 10_000)
  episode = collector.new(EXAMPLE)
  for code in ('def f(x):\n  return 3*x', 'def f(x):\n  return 3*x+1'):
    ids = tok.encode(code) + [tok.eos_id]
    asyncio.run(collector.advance(episode, ids, [0.0] * len(ids)))
  assert episode.reward == 0.5 and episode.info['corrected'] == 1
  assert 'user: Failed: f(0) should be 1, got 0\n' in tok.decode(
      episode.transcript.tokens)


def test_a_sandbox_that_cannot_start_weighs_its_group_zero(pool):
  """One process allowed: bwrap cannot fork, so no test runs at all. The
  step counts it, the group's weight is 0, and past the configured share
  the step stops with one sentence."""
  env = envs.CodeEnv(pool, sandbox.Limits(processes=1))
  env.reset(EXAMPLE)
  step = asyncio.run(env.step(EXAMPLE['answer']))
  assert step.info['sandbox_failures'] == 3 and step.reward == 0
  made = lambda failures: episodes.Episode(
      {}, env, None, info=Counter(sandbox_failures=failures))
  found = [made(0), made(0), made(0), made(step.info['sandbox_failures']),
           made(0), made(0), made(0), made(0)]
  assert agentic_job.group_weights(found, 2, 0.25) == [1.0, 0.0, 1.0, 1.0]
  with pytest.raises(InfrastructureError, match='failed to start in 1 of '
                     "this step's 4 groups"):
    agentic_job.group_weights(found, 2, 0.2)
