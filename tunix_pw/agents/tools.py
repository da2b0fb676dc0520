"""Tools an agent calls: plain Python functions with typed arguments.

`@tool` registers a function by name; its JSON-schema signature (the
OpenAI function format that chat templates' `tools` variable takes) comes
from its type hints and docstring. `run` calls one on a worker thread with
a time limit: an exception or a timeout becomes an error result that the
model reads, never a crash. A timed-out call's thread cannot be killed; it
finishes in the background while the episode goes on (tools that may hang
should bound themselves, as the code sandbox does).
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Callable
import concurrent.futures
import dataclasses
import inspect
import operator
from typing import Any

from tunix_pw import registry
from tunix_pw.errors import UsageError

_JSON_TYPES = {str: 'string', int: 'integer', float: 'number',
               bool: 'boolean', list: 'array', dict: 'object'}


@dataclasses.dataclass(frozen=True)
class Tool:
  name: str
  fn: Callable[..., Any]
  description: str
  parameters: dict[str, str]  # argument -> JSON type, in signature order
  required: tuple[str, ...]

  @property
  def schema(self) -> dict[str, Any]:
    return {'type': 'function', 'function': {
        'name': self.name, 'description': self.description,
        'parameters': {'type': 'object', 'properties': {
            k: {'type': v} for k, v in self.parameters.items()},
                       'required': list(self.required)}}}

  @property
  def signature(self) -> str:
    """One line for templates without a `tools` variable."""
    args = ', '.join(f'{k}: {v}' for k, v in self.parameters.items())
    return f'{self.name}({args}): {self.description}'


def describe(fn: Callable[..., Any]) -> Tool:
  """`fn` as a tool; every argument needs a JSON type hint."""
  hints = inspect.get_annotations(fn, eval_str=True)
  params = inspect.signature(fn).parameters
  missing = [p for p in params if hints.get(p) not in _JSON_TYPES]
  if missing:
    raise TypeError(f'tool {fn.__name__}: argument {missing[0]} needs a '
                    f'type hint among {[t.__name__ for t in _JSON_TYPES]}')
  return Tool(fn.__name__, fn, (inspect.getdoc(fn) or '').split('\n')[0],
              {p: _JSON_TYPES[hints[p]] for p in params},
              tuple(p for p, v in params.items() if v.default is v.empty))


def tool(fn: Callable[..., Any]) -> Callable[..., Any]:
  """Registers `fn` as a tool under its name."""
  registry.register('tool', fn.__name__)(describe(fn))
  return fn


def get(names: str, field: str = '--config.agent.tools') -> list[Tool]:
  """The tools of a comma-separated list of names."""
  out = []
  for name in filter(None, (n.strip() for n in names.split(','))):
    if name not in registry.names('tool'):
      raise UsageError(f'{field} names {name!r}, not a registered tool; use '
                       f'one of {", ".join(registry.names("tool"))}.')
    out.append(registry.get('tool', name))
  return out


@dataclasses.dataclass(frozen=True)
class Result:
  text: str
  error: str = ''  # '', 'exception', 'timeout', 'arguments' or 'unknown'


async def run(tools: dict[str, Tool], name: str, arguments: dict[str, Any],
              timeout: float, executor: concurrent.futures.Executor
              ) -> Result:
  """Calls tool `name` on `executor` within `timeout` seconds."""
  if name not in tools:
    return Result(f'error: no tool named {name!r}; tools: '
                  f'{", ".join(tools)}', 'unknown')
  t = tools[name]
  unknown = set(arguments) - set(t.parameters)
  absent = set(t.required) - set(arguments)
  if unknown or absent:
    return Result(f'error: {name} takes {", ".join(t.parameters)} '
                  f'({", ".join(t.required)} required)', 'arguments')
  loop = asyncio.get_running_loop()
  try:
    value = await asyncio.wait_for(loop.run_in_executor(
        executor, lambda: t.fn(**arguments)), timeout)
  except TimeoutError:
    return Result(f'error: {name} timed out after {timeout:g} s', 'timeout')
  except Exception as e:  # pylint: disable=broad-except
    return Result(f'error: {type(e).__name__}: {e}', 'exception')
  return Result(str(value))


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def _evaluate(node: ast.AST) -> int | float:
  if isinstance(node, ast.Constant) and type(node.value) in (int, float):
    return node.value
  if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
    return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
  if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
    return _OPS[type(node.op)](_evaluate(node.operand))
  raise ValueError('only numbers, + - * and parentheses are allowed')


@tool
def calculator(expression: str) -> str:
  """Evaluates numbers with + - * and parentheses."""
  if len(expression) > 200:
    raise ValueError('expression longer than 200 characters')
  try:
    tree = ast.parse(expression.strip(), mode='eval')
  except SyntaxError:
    raise ValueError(f'{expression!r} is not an expression') from None
  return str(_evaluate(tree.body))
