"""Hugging Face chat templates, rendered the way transformers renders them.

The same Jinja environment transformers builds (a sandbox, `trim_blocks`,
`lstrip_blocks`, loop controls, `tojson` without HTML escaping,
`raise_exception`, `strftime_now`, the `{% generation %}` block) and the same
variables (`messages`, `tools`, `documents`, `add_generation_prompt`, the
special tokens, and any template switch such as Qwen 3's `enable_thinking`),
so the text, and hence the ids, equal `apply_chat_template`'s.

A template is code from a checkpoint. The sandbox keeps it from touching
anything; a work budget keeps it from running forever: every loop iteration
and every call spends one step, and `*` / `**` may not build huge values.
Any failure, the budget's included, is a UsageError naming the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
import contextvars
import datetime
import json
from typing import Any

import jinja2
import jinja2.ext  # not loaded by `import jinja2` alone
from jinja2 import nodes, runtime, sandbox

from tunix_pw.errors import UsageError

MAX_STEPS = 1_000_000  # loop iterations + calls per render (~1 s)
MAX_VALUE = 1 << 20  # items a `*` may build; bits a `**` may build
# Private-use characters that bracket {% generation %} output while spans are
# being recorded; stripped from the text before it is returned.
_OPEN, _CLOSE = '\ue000', '\ue001'


class _OutOfSteps(Exception):
  pass


_steps: contextvars.ContextVar[list[int]] = contextvars.ContextVar('steps')
_spans: contextvars.ContextVar[bool] = contextvars.ContextVar(
    'spans', default=False)


def _spend() -> None:
  left = _steps.get()
  left[0] -= 1
  if left[0] < 0:
    raise _OutOfSteps(f'more than {MAX_STEPS:,} loop iterations and calls')


def _bounded(iterable: Iterable[Any]) -> list[Any]:
  items = []
  for item in iterable:
    _spend()
    items.append(item)
  return items


class _Sandbox(sandbox.ImmutableSandboxedEnvironment):
  """The sandbox, with every call counted and `*`, `**` bounded."""

  intercepted_binops = frozenset({'*', '**'})

  # pylint: disable-next=no-self-argument
  def call(__self, __context, __obj, *args, **kwargs):
    _spend()
    if isinstance(__obj, runtime.LoopContext) and args:  # a recursive loop
      args = (_bounded(args[0]),) + args[1:]
    return super().call(__context, __obj, *args, **kwargs)

  def call_binop(self, context, operator, left, right):
    if operator == '*':
      sequence, count = (left, right) if isinstance(right, int) else (right,
                                                                       left)
      if (isinstance(sequence, (str, list, tuple)) and isinstance(count, int)
          and len(sequence) * count > MAX_VALUE):
        raise OverflowError(f'`*` would build more than {MAX_VALUE:,} items')
    if (operator == '**' and isinstance(left, int) and isinstance(right, int)
        and abs(left) > 1 and right * left.bit_length() > MAX_VALUE):
      raise OverflowError(f'`**` would build more than {MAX_VALUE:,} bits')
    return super().call_binop(context, operator, left, right)


class _Generation(jinja2.ext.Extension):
  """`{% generation %}...{% endgeneration %}`: marks what the assistant
  wrote (transformers' assistant-token mask reads these spans)."""

  tags = {'generation'}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(('name:endgeneration',), drop_needle=True)
    return nodes.CallBlock(self.call_method('_mark'), [], [],
                           body).set_lineno(lineno)

  def _mark(self, caller) -> str:
    text = caller()
    return f'{_OPEN}{text}{_CLOSE}' if _spans.get() else text


def _tojson(value, ensure_ascii=False, indent=None, separators=None,
            sort_keys=False) -> str:
  return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                    separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
  raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
  return datetime.datetime.now().strftime(fmt)


def _bound_loops(tree: nodes.Template) -> nodes.Template:
  """Every `{% for %}` iterates through `_bounded`, which spends a step per
  item (its iterable materialised as a list, which iterates the same)."""
  for loop in tree.find_all(nodes.For):
    loop.iter = nodes.Filter(loop.iter, '_bounded', [], [], None, None)
  return tree


class ChatTemplate:
  """A compiled chat template; `origin` names its file in errors."""

  def __init__(self, source: str, origin: str, special_tokens: dict[str, str]):
    self.origin, self.source = origin, source
    self.special_tokens = dict(special_tokens)
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True,
                   extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters['tojson'] = _tojson
    env.filters['_bounded'] = _bounded
    env.globals['raise_exception'] = _raise_exception
    env.globals['strftime_now'] = _strftime_now
    try:
      self.template = env.from_string(_bound_loops(env.parse(source)))
    except jinja2.TemplateError as e:
      raise UsageError(f'{origin}: the chat template does not compile '
                       f'({type(e).__name__}: {e}).') from None

  def render(self, messages: Sequence[dict[str, Any]],
             add_generation_prompt: bool = True,
             tools: Sequence[dict[str, Any]] | None = None,
             documents: Sequence[dict[str, Any]] | None = None,
             **switches: Any) -> str:
    """The text transformers' `apply_chat_template(tokenize=False)` gives;
    `switches` are extra template variables (e.g. enable_thinking=False)."""
    return self._render(messages, add_generation_prompt, tools, documents,
                        switches, spans=False)

  def render_with_spans(
      self, messages: Sequence[dict[str, Any]],
      add_generation_prompt: bool = False,
      tools: Sequence[dict[str, Any]] | None = None,
      documents: Sequence[dict[str, Any]] | None = None,
      **switches: Any) -> tuple[str, list[tuple[int, int]]]:
    """The text, and the [start, end) character spans of its
    `{% generation %}` blocks (what an assistant-only loss masks)."""
    marked = self._render(messages, add_generation_prompt, tools, documents,
                          switches, spans=True)
    text, spans, start = [], [], 0
    for i, part in enumerate(marked.replace(_CLOSE, _OPEN).split(_OPEN)):
      if i % 2:
        spans.append((start, start + len(part)))
      text.append(part)
      start += len(part)
    return ''.join(text), spans

  def _render(self, messages, add_generation_prompt, tools, documents,
              switches, spans: bool) -> str:
    steps, marking = _steps.set([MAX_STEPS]), _spans.set(spans)
    try:
      return self.template.render(
          messages=list(messages), tools=tools, documents=documents,
          add_generation_prompt=add_generation_prompt,
          **{**self.special_tokens, **switches})
    except Exception as e:  # pylint: disable=broad-exception-caught
      # A template is a program from the checkpoint: whatever it raises.
      raise UsageError(f'{self.origin}: the chat template failed to render '
                       f'({type(e).__name__}: {e}).') from None
    finally:
      _steps.reset(steps)
      _spans.reset(marking)
