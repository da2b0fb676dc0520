"""Environments: what an agent talks to, turn by turn.

An environment takes a dataset example and answers each model turn:

  reset(example) -> the opening messages
  await step(model_turn_text) -> Step(observation messages | None, reward,
                                      done, info counts)

`ToolEnv` runs the tools a turn calls (concurrently, each under the time
limit) and shows the model their results; a turn with no call is the
answer, scored against the example's; a malformed call shows the model the
error. Environments are registered by name (`--config.agent.env`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
import concurrent.futures
import dataclasses
import json
import re
import secrets
from typing import Any, Protocol

from absl import logging
import numpy as np

from tunix_pw import registry, sandbox
from tunix_pw.agents import calls as calls_lib, tools as tools_lib
from tunix_pw.errors import UsageError
from tunix_pw.rl import rewards
from tunix_pw.train.evaluate import Verifier

Message = dict[str, str]


@dataclasses.dataclass(frozen=True)
class Step:
  observation: list[Message] | None  # None once done
  reward: float
  done: bool
  info: dict[str, int]  # counts: tool_calls, malformed_calls, tool_errors...
  feedback: str = ''  # the verifier's word on a wrong answer
  solved: bool = False  # the verifier's verdict on the answer
  # Ended without an answer: the count's name (e.g. 'out_of_turns'); the
  # collector adds agent.failure_reward, as for time and context.
  failed: str = ''


class Env(Protocol):

  def reset(self, example: dict[str, Any]) -> list[Message]: ...

  async def step(self, model_turn: str) -> Step: ...


@dataclasses.dataclass
class ToolEnv:
  """Tools, called in `fmt`'s format, until the model answers or runs out
  of turns (`failed='out_of_turns'`: the collector adds the failure
  reward). Answers are right (reward 1, solved) by `verifier` (by
  default when their last number is the example's answer); a turn whose
  call does not parse earns `malformed_reward`."""

  tools: list[tools_lib.Tool]
  fmt: str
  max_turns: int
  tool_timeout: float
  executor: concurrent.futures.Executor
  opening: list[Message] = dataclasses.field(default_factory=list)
  malformed_reward: float = 0.0
  verifier: Verifier = rewards.EXACT_ANSWER

  def reset(self, example: dict[str, Any]) -> list[Message]:
    self.answer, self.turns = example['answer'], 0
    return self.opening + [dict(role='user', content=example['question'])]

  async def step(self, model_turn: str) -> Step:
    self.turns += 1
    try:
      calls = calls_lib.parse(self.fmt, model_turn)
    except calls_lib.Malformed as e:
      info = {'malformed_calls': 1}
      observation = [calls_lib.result_message(self.fmt, f'error: {e}')]
    else:
      if not calls:
        right, feedback = self.verifier.verdict(model_turn, self.answer)
        return Step(None, float(right), True, {'answers': 1}, feedback,
                    solved=right)
      by_name = {t.name: t for t in self.tools}
      results = await asyncio.gather(*(
          tools_lib.run(by_name, c.name, c.arguments, self.tool_timeout,
                        self.executor) for c in calls))
      info = {'tool_calls': len(calls)}
      for r in results:
        if r.error:
          key = f'tool_{r.error}s' if r.error != 'arguments' else (
              'tool_argument_errors')
          info[key] = info.get(key, 0) + 1
      observation = [calls_lib.result_message(self.fmt, r.text)
                     for r in results]
    reward = self.malformed_reward if 'malformed_calls' in info else 0.0
    if self.turns >= self.max_turns:
      return Step(None, reward, True, info, failed='out_of_turns')
    return Step(observation, reward, False, info)


@dataclasses.dataclass
class Retry:
  """Self-correction: after an answer not solved, `feedback` (its
  `{feedback}`: the verifier's word) and another attempt, up to
  `attempts` answers. A first answer earns its reward, a later one
  `corrected` times it; right ones are counted as `first_right` and
  `corrected`."""

  inner: Env
  attempts: int
  corrected: float
  feedback: str

  def reset(self, example: dict[str, Any]) -> list[Message]:
    self.attempt = 1
    return self.inner.reset(example)

  async def step(self, model_turn: str) -> Step:
    step = await self.inner.step(model_turn)
    if not step.done or 'answers' not in step.info:
      return step  # a tool turn, or out of turns
    if not step.solved and self.attempt < self.attempts:
      self.attempt += 1
      return Step([dict(role='user', content=self.feedback.format(
          feedback=step.feedback))], 0.0, False,
                  dict(step.info, wrong_answers=1))
    first = self.attempt == 1
    info = dict(step.info, **({('first_right' if first else 'corrected'): 1}
                              if step.solved else {}))
    return Step(None, step.reward * (1.0 if first else self.corrected),
                True, info, solved=step.solved)


_LAST_NUMBER = re.compile(r'-?\d+(?!.*\d)', re.DOTALL)


def wrong_start(task: 'Task', example: dict[str, Any],
                rng: np.random.Generator) -> list[str]:
  """A wrong first attempt at `example` for self-correction practice: the
  task's demonstration with its answer's last number moved 1 to 9 either
  way."""
  *before, last = task.demonstration(example)
  found = _LAST_NUMBER.search(last)
  if not found:
    raise UsageError('--config.agent.practice needs answers that end in a '
                     f'number; this task answers {last!r}.')
  moved = int(found.group()) + int(rng.choice([-1, 1]) * rng.integers(1, 10))
  return [*before, last[:found.start()] + str(moved) + last[found.end():]]


@dataclasses.dataclass(frozen=True)
class Task:
  """A registered environment, set up for one run."""

  new: Callable[[], Env]  # a fresh environment, one per episode
  template_vars: dict[str, Any]  # for the chat template (e.g. its tools)
  demonstration: Callable[[dict[str, Any]], list[str]]  # right model turns


@dataclasses.dataclass(frozen=True)
class Environment:
  """What `--config.agent.env` names: `setup(agent, tokenizer, executor)`
  -> the run's Task; `sandboxed`: its episodes run code in the sandbox,
  which is checked before the run."""

  setup: Callable[..., Task]
  sandboxed: bool = False


def environment(name: str, sandboxed: bool = False):
  """Registers a Task's setup function as environment `name`."""
  def decorate(setup: Callable[..., Task]) -> Callable[..., Task]:
    registry.register('environment', name)(Environment(setup, sandboxed))
    return setup
  return decorate


@environment('calculator')
def calculator(agent: Any, tokenizer: Any,
               executor: concurrent.futures.Executor) -> Task:
  """Arithmetic problems ('48213+91725=') with a calculator tool."""
  tools = tools_lib.get(agent.tools)
  opening, template_vars = calls_lib.tool_context(tokenizer, tools,
                                                  agent.call_format)

  def demonstration(example: dict[str, Any]) -> list[str]:
    expression = example['question'].rstrip('=')
    call = calls_lib.Call('calculator', dict(expression=expression))
    return [calls_lib.render(agent.call_format, call),
            tools_lib.calculator(expression)]  # what the tool will say

  return Task(lambda: ToolEnv(tools, agent.call_format, agent.max_turns,
                              agent.tool_timeout, executor, opening,
                              agent.malformed_reward, judge(agent)),
              template_vars, demonstration)


@environment('answer')
def answer(agent: Any, tokenizer: Any,
           executor: concurrent.futures.Executor) -> Task:
  """Questions answered at once, no tools (self-correction's base)."""
  del tokenizer
  return Task(lambda: ToolEnv([], agent.call_format, agent.max_turns,
                              agent.tool_timeout, executor,
                              verifier=judge(agent)), {},
              lambda example: [example['answer']])


def judge(agent: Any) -> Verifier:
  """--config.agent.verifier: how an environment judges answers."""
  return rewards.verifier(agent.verifier, field='--config.agent.verifier')


_FENCE = re.compile(r'```(?:python)?\n(.*?)```', re.DOTALL)


@dataclasses.dataclass
class CodeEnv:
  """Python code checked by the example's tests, each in a sandbox run of
  its own: the code, then the call's repr printed after a random marker
  the code never sees; a test passes when the marked line is the expected
  text (compared here, outside: code that exits early or prints a verdict
  passes nothing). Reward: the fraction passed. A sandbox that could not
  start is counted (`sandbox_failures`): its episode's group gets weight 0
  (jobs/agentic.py)."""

  executor: concurrent.futures.Executor
  limits: sandbox.Limits

  def reset(self, example: dict[str, Any]) -> list[Message]:
    self.tests = json.loads(example['tests'])
    return [dict(role='user', content=example['question'])]

  async def step(self, model_turn: str) -> Step:
    fenced = _FENCE.findall(model_turn)
    code = fenced[-1] if fenced else model_turn
    marker = secrets.token_hex(8)
    loop = asyncio.get_running_loop()
    runs = await asyncio.gather(*(loop.run_in_executor(
        self.executor, sandbox.run_python,
        f'{code}\nprint({marker!r} + repr({t["call"]}))', '', self.limits)
                                  for t in self.tests))
    if failed := [r for r in runs if not r.started]:
      logging.warning('%d sandbox runs did not start: %s', len(failed),
                      failed[0].stderr.strip()[-300:])
    got = [next((line[len(marker):] for line in r.stdout.splitlines()
                 if line.startswith(marker)), None) for r in runs]
    passed = [g == t['expected'] for g, t in zip(got, self.tests)]
    feedback = ''
    for t, r, g, p in zip(self.tests, runs, got, passed):
      if not p:  # the first failure, in words
        errors = r.stderr.strip().splitlines() or ['no output']
        why = g if g is not None else (
            'killed at a limit' if r.killed else errors[-1])
        feedback = f'{t["call"]} should be {t["expected"]}, got {why[:200]}'
        break
    return Step(None, sum(passed) / len(passed), True, dict(
        answers=1, tests=len(passed), tests_passed=sum(passed),
        sandbox_limits=sum(r.killed for r in runs),
        sandbox_failures=sum(not r.started for r in runs)), feedback,
                solved=all(passed))


@environment('code', sandboxed=True)
def code(agent: Any, tokenizer: Any,
         executor: concurrent.futures.Executor) -> Task:
  """Python functions checked by unit tests in the sandbox (the `code`
  dataset); the reference solution is the demonstration."""
  del tokenizer
  limits = sandbox.Limits(cpu_s=2, wall_s=agent.tool_timeout)
  return Task(lambda: CodeEnv(executor, limits), {},
              lambda example: [f'```python\n{example["answer"]}\n```'])


def check(agent: Any) -> None:
  registry.check('environment', agent.env, '--config.agent.env')
  judge(agent)
  if agent.call_format not in calls_lib.FORMATS:
    raise UsageError(f'--config.agent.call_format={agent.call_format!r} must '
                     f'be one of {", ".join(calls_lib.FORMATS)}.')
  tools_lib.get(agent.tools)
  if registry.get('environment', agent.env).sandboxed:
    sandbox.check_available()
  if not 0 <= agent.max_sandbox_failures <= 1:
    raise UsageError('--config.agent.max_sandbox_failures='
                     f'{agent.max_sandbox_failures} must be from 0 to 1 (the '
                     'share of a step\'s groups).')
  if agent.attempts < 1 or agent.attempts > agent.max_turns:
    raise UsageError(f'--config.agent.attempts={agent.attempts} must be '
                     f'from 1 to --config.agent.max_turns={agent.max_turns}.')
  if not 0 <= agent.practice <= 1 or (agent.practice and agent.attempts < 2):
    raise UsageError(f'--config.agent.practice={agent.practice} must be from '
                     '0 to 1, and above 0 only with agent.attempts >= 2 (it '
                     'starts episodes from a wrong first answer).')


def task(agent: Any, tokenizer: Any,
         executor: concurrent.futures.Executor) -> Task:
  """--config.agent.env's task (with retries: agent.attempts > 1)."""
  check(agent)
  base = registry.get('environment', agent.env).setup(agent, tokenizer,
                                                     executor)
  if agent.attempts <= 1:
    return base
  return dataclasses.replace(base, new=lambda: Retry(
      base.new(), agent.attempts, agent.corrected_reward, agent.feedback))
