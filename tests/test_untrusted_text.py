"""Every parser of model text (tool calls, final answers, judge scores),
fed arbitrary text up to 64k characters (deep nesting, long runs of one
character): each raises only its documented error, in bounded time."""

import time

from hypothesis import HealthCheck, given, settings, strategies as st
import pytest

from tunix_pw.agents import calls
from tunix_pw.rl import judge, math_equal, rewards

# Characters that parsers treat specially, and a few that they do not.
SPECIAL = list('[]{}()-+*/^\\"\',:;=.\n\t ') + [
    '<tool_call>', '</tool_call>', '```tool_code\n', '```', '\\boxed{',
    '\\frac{', '\\sqrt', 'answer is', '\\text{', '0', '9', 'a', '\x00',
    '\ud7ff', 'é']


@st.composite
def hostile(draw):
  """A run of one piece (up to 64k characters), nested openers and
  closers, and random text around them."""
  piece = draw(st.sampled_from(SPECIAL))
  closer = draw(st.sampled_from(SPECIAL))
  n = draw(st.integers(0, 64000 // max(len(piece), 1)))
  m = draw(st.integers(0, 2000))
  return (draw(st.text(max_size=50)) + piece * n + closer * m +
          draw(st.text(max_size=50)))[:65536]


FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=list(HealthCheck))


@FUZZ
@given(hostile(), st.sampled_from(calls.FORMATS))
def test_tool_call_parsers_raise_only_malformed(text, fmt):
  start = time.monotonic()
  try:
    found = calls.parse(fmt, text)
  except calls.Malformed:
    found = []
  assert all(isinstance(c, calls.Call) for c in found)
  assert time.monotonic() - start < 2


@FUZZ
@given(hostile())
def test_answer_and_score_parsers_never_raise(text):
  start = time.monotonic()
  assert isinstance(math_equal.final_answer(text), str)
  assert isinstance(math_equal.normalise(text), str)
  score = judge.parse(text, 10)
  assert score is None or 0 <= score <= 1
  value = rewards.number(text)
  assert value is None or isinstance(value, float)
  assert time.monotonic() - start < 2


@pytest.mark.parametrize('fmt, text', [
    ('qwen', '<tool_call>' + '[' * 2000 + '</tool_call>'),
    ('llama', '{"name": "f", "parameters": ' + '[' * 2000),
    ('gemma', '```tool_code\nf(x=' + '-' * 5000 + '1)\n```'),
    ('gemma', '```tool_code\nf(x=' + '(' * 300 + '1' + ')' * 300 + ')\n```'),
    ('gemma', '```tool_code\nf(x=[' + '[' * 3000 + ')\n```'),
    ('qwen', '<tool_call>' * 6000),
    ('gemma', '```tool_code\n' + 'x' * 20000 + '\n```'),
    ('gemma', '```tool_code\nf(x="\x00")\n```'),
])
def test_found_by_fuzzing_deep_or_long_calls_are_malformed(fmt, text):
  with pytest.raises(calls.Malformed):
    calls.parse(fmt, text)
