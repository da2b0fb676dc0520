"""Tool calls in three model families' formats: parsing a model turn, and
the messages that carry tools and results back.

  qwen    <tool_call>{"name": "calculator", "arguments": {...}}</tool_call>
          (any number per turn); results as 'tool' messages, which Qwen's
          template wraps in <tool_response>.
  llama   Llama 3.1's JSON call: the whole turn is {"name": ...,
          "parameters": {...}} (after an optional <|python_tag|>); results
          as 'ipython' messages.
  gemma   a Python call in a fence, parsed with `ast` and never executed:
          ```tool_code
          calculator(expression="12+30")
          ```
          keyword arguments of literal values only; results as a user turn
          holding a ```tool_output fence (Gemma's turns have no tool role).

A turn with no call is the model's answer. A call that does not parse is
`Malformed`: the environment shows the model the error. Parsing is bounded
for any text: calls are found by a linear scan, a call's body over
`MAX_CALL_CHARS` is malformed, and nesting too deep for the parser (JSON's
recursion, `ast`'s) is malformed too; `parse` raises nothing else.

Tools reach the model through the chat template's `tools` variable where the
template reads one (Llama 3.1, Qwen 3 and Gemma 3 checkpoints' templates);
otherwise (the character tokenizer, SentencePiece Gemma, templates without
tools) as a system message of one `name(argument: type, ...): description`
line per tool and a line showing the call format, which Gemma's turns fold
into the first user turn and the character tokenizer renders as `system:
...`.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from typing import Any

from tunix_pw.agents.tools import Tool

FORMATS = ('qwen', 'llama', 'gemma')
MAX_CALL_CHARS = 16384
# What the parsers raise on deep nesting or odd bytes, besides their errors.
_PARSER_LIMITS = (RecursionError, MemoryError, ValueError, SyntaxError)
_RESULT_ROLE = {'qwen': 'tool', 'llama': 'ipython', 'gemma': 'user'}
EXAMPLE = {'qwen': '<tool_call>{"name": NAME, "arguments": {...}}'
                   '</tool_call>',
           'llama': '{"name": NAME, "parameters": {...}}',
           'gemma': '```tool_code\nNAME(argument=value)\n```'}


@dataclasses.dataclass(frozen=True)
class Call:
  name: str
  arguments: dict[str, Any]


class Malformed(ValueError):
  """A call the model attempted that does not parse (the message says
  why, for the model to read)."""


def _bounded(body: str) -> str:
  if len(body) > MAX_CALL_CHARS:
    raise Malformed(f'the call is over {MAX_CALL_CHARS} characters')
  return body


def _between(text: str, opening: str, closing: str) -> tuple[list[str], bool]:
  """The bodies of `opening`...`closing` pairs in `text`, and whether an
  opening is left unclosed (a linear scan: a lazy regex over many
  unclosed openings takes quadratic time)."""
  bodies, at = [], 0
  while (start := text.find(opening, at)) >= 0:
    end = text.find(closing, start + len(opening))
    if end < 0:
      return bodies, True
    bodies.append(text[start + len(opening):end])
    at = end + len(closing)
  return bodies, False


def _json_call(body: str, arguments_key: str) -> Call:
  try:
    value = json.loads(_bounded(body))
  except _PARSER_LIMITS as e:
    raise Malformed(f'the call is not valid JSON ({type(e).__name__}: '
                    f'{str(e)[:100]})') from None
  if not isinstance(value, dict) or not isinstance(value.get('name'), str):
    raise Malformed('a call is a JSON object with a "name" string')
  arguments = value.get(arguments_key, value.get('arguments', {}))
  if isinstance(arguments, str):  # some models write them as a JSON string
    try:
      arguments = json.loads(arguments)
    except _PARSER_LIMITS:
      raise Malformed(f'"{arguments_key}" is not a JSON object') from None
  if not isinstance(arguments, dict):
    raise Malformed(f'"{arguments_key}" is not a JSON object')
  return Call(value['name'], arguments)


def _python_call(body: str) -> Call:
  try:  # parsed to a tree, never compiled to code or run
    node = ast.parse(_bounded(body).strip(), mode='eval').body
  except _PARSER_LIMITS as e:
    raise Malformed('the call is not Python syntax '
                    f'({getattr(e, "msg", type(e).__name__)})') from None
  if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
    raise Malformed('write one call: name(argument=value, ...)')
  if node.args or any(k.arg is None for k in node.keywords):
    raise Malformed('pass every argument by keyword: name(argument=value)')
  try:
    return Call(node.func.id, {k.arg: ast.literal_eval(k.value)
                               for k in node.keywords})
  except _PARSER_LIMITS + (TypeError,):
    raise Malformed('argument values must be literals (numbers, strings, '
                    'lists)') from None


def parse(fmt: str, text: str) -> list[Call]:
  """The calls of a model turn ([] for an answer); Malformed when the turn
  attempts a call that does not parse."""
  if fmt == 'qwen':
    bodies, unclosed = _between(text, '<tool_call>', '</tool_call>')
    if not bodies and unclosed:
      raise Malformed('a <tool_call> is not closed by </tool_call>')
    return [_json_call(body, 'arguments') for body in bodies]
  if fmt == 'llama':
    body = text.strip().removeprefix('<|python_tag|>').strip()
    return [_json_call(body, 'parameters')] if body.startswith('{') else []
  if fmt == 'gemma':
    bodies, _ = _between(text, '```tool_code\n', '```')
    if not bodies and '```tool_code' in text:
      raise Malformed('a ```tool_code fence is not closed by ```')
    return [_python_call(body.removesuffix('\n')) for body in bodies]
  raise ValueError(f'unknown call format {fmt!r}')


def render(fmt: str, call: Call) -> str:
  """A call as the model writes it (demonstrations, tests)."""
  if fmt == 'gemma':
    args = ', '.join(f'{k}={v!r}' for k, v in call.arguments.items())
    return f'```tool_code\n{call.name}({args})\n```'
  key = 'parameters' if fmt == 'llama' else 'arguments'
  body = json.dumps({'name': call.name, key: call.arguments})
  return f'<tool_call>{body}</tool_call>' if fmt == 'qwen' else body


def result_message(fmt: str, text: str) -> dict[str, str]:
  """A tool's result (or an error) as the message the model reads next."""
  if fmt == 'gemma':
    return dict(role='user', content=f'```tool_output\n{text}\n```')
  return dict(role=_RESULT_ROLE[fmt], content=text)


def reads_tools(tokenizer: Any) -> bool:
  """Whether the tokenizer's chat template reads a `tools` variable."""
  template = getattr(tokenizer, 'template', None)
  return bool(template) and 'tools' in template.source


def tool_context(tokenizer: Any, tools: list[Tool], fmt: str
                 ) -> tuple[list[dict[str, str]], dict[str, Any]]:
  """(messages to open the chat with, the template's variables): the tools
  through the template's `tools`, or as a system message."""
  if reads_tools(tokenizer):
    return [], {'tools': [t.schema for t in tools]}
  lines = [t.signature for t in tools] + [f'call: {EXAMPLE[fmt]}']
  return [dict(role='system', content='\n'.join(lines))], {}
