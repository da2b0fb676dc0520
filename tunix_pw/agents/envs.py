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
from typing import Any, Protocol

from tunix_pw.agents import calls as calls_lib, tools as tools_lib
from tunix_pw.errors import UsageError
from tunix_pw.rl import rewards

Message = dict[str, str]


@dataclasses.dataclass(frozen=True)
class Step:
  observation: list[Message] | None  # None once done
  reward: float
  done: bool
  info: dict[str, int]  # counts: tool_calls, malformed_calls, tool_errors...


class Env(Protocol):

  def reset(self, example: dict[str, Any]) -> list[Message]: ...

  async def step(self, model_turn: str) -> Step: ...


@dataclasses.dataclass
class ToolEnv:
  """Tools, called in `fmt`'s format, until the model answers or runs out
  of turns (then reward 0). Answers are right when their last number is
  the example's answer."""

  tools: list[tools_lib.Tool]
  fmt: str
  max_turns: int
  tool_timeout: float
  executor: concurrent.futures.Executor
  opening: list[Message] = dataclasses.field(default_factory=list)

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
        right = rewards.exact_answer(rewards.Sample(
            prompt='', completion=model_turn, answer=self.answer,
            length=0, budget=0, truncated=False))
        return Step(None, right, True, {'answers': 1})
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
    if self.turns >= self.max_turns:
      return Step(None, 0.0, True, dict(info, out_of_turns=1))
    return Step(observation, 0.0, False, info)


@dataclasses.dataclass(frozen=True)
class Task:
  """A registered environment, set up for one run."""

  new: Callable[[], Env]  # a fresh environment, one per episode
  template_vars: dict[str, Any]  # for the chat template (e.g. its tools)
  demonstration: Callable[[dict[str, Any]], list[str]]  # right model turns


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
                              agent.tool_timeout, executor, opening),
              template_vars, demonstration)


ENVS: dict[str, Callable[..., Task]] = {'calculator': calculator}


def check(agent: Any) -> None:
  if agent.env not in ENVS:
    raise UsageError(f'--config.agent.env={agent.env!r} is not a registered '
                     f'environment; use one of {", ".join(sorted(ENVS))}.')
  if agent.call_format not in calls_lib.FORMATS:
    raise UsageError(f'--config.agent.call_format={agent.call_format!r} must '
                     f'be one of {", ".join(calls_lib.FORMATS)}.')
  tools_lib.get(agent.tools)


def task(agent: Any, tokenizer: Any,
         executor: concurrent.futures.Executor) -> Task:
  """--config.agent.env's task."""
  check(agent)
  return ENVS[agent.env](agent, tokenizer, executor)
