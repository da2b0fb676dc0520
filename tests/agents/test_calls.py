"""Tool calls in three formats, and tools run under their limits."""

import asyncio
import concurrent.futures
import time

import pytest

from tunix_pw.agents import calls, tools
from tunix_pw.errors import UsageError

CALL = calls.Call('calculator', {'expression': '12+30'})


@pytest.mark.parametrize('fmt,text', [
    ('qwen', 'Let me compute. <tool_call>{"name": "calculator", '
             '"arguments": {"expression": "12+30"}}</tool_call>'),
    ('qwen', '<tool_call>\n{"name": "calculator", "arguments": '
             '"{\\"expression\\": \\"12+30\\"}"}\n</tool_call>'),
    ('llama', '{"name": "calculator", "parameters": {"expression": '
              '"12+30"}}'),
    ('llama', '<|python_tag|>{"name": "calculator", "parameters": '
              '{"expression": "12+30"}}'),
    ('gemma', 'I will call it.\n```tool_code\ncalculator(expression='
              '"12+30")\n```'),
])
def test_each_format_parses_its_calls(fmt, text):
  assert calls.parse(fmt, text) == [CALL]


@pytest.mark.parametrize('fmt', calls.FORMATS)
def test_rendered_calls_parse_back_and_answers_have_none(fmt):
  assert calls.parse(fmt, calls.render(fmt, CALL)) == [CALL]
  assert calls.parse(fmt, 'The answer is 42.') == []


def test_several_qwen_calls_in_one_turn():
  text = calls.render('qwen', CALL) + '\n' + calls.render(
      'qwen', calls.Call('calculator', {'expression': '2*3'}))
  assert [c.arguments['expression'] for c in calls.parse('qwen', text)] == [
      '12+30', '2*3']


@pytest.mark.parametrize('fmt,text,why', [
    ('qwen', '<tool_call>{"name": "calculator", "arguments": {', 'not closed'),
    ('qwen', '<tool_call>{"name": calculator}</tool_call>', 'valid JSON'),
    ('qwen', '<tool_call>["calculator"]</tool_call>', '"name" string'),
    ('qwen', '<tool_call>{"name": "c", "arguments": 3}</tool_call>',
     'JSON object'),
    ('llama', '{"name": "calculator", "parameters": {"expression": ',
     'valid JSON'),
    ('gemma', '```tool_code\ncalculator(expression="1+1"\n```', 'syntax'),
    ('gemma', '```tool_code\ncalculator("1+1")\n```', 'keyword'),
    ('gemma', '```tool_code\nx + 3\n```', 'one call'),
    ('gemma', '```tool_code\ncalculator(expression="1")', 'not closed'),
    ('gemma', '```tool_code\nos.system(cmd="ls")\n```', 'one call'),
])
def test_malformed_calls_say_why(fmt, text, why):
  with pytest.raises(calls.Malformed, match=why):
    calls.parse(fmt, text)


def test_gemma_calls_are_never_executed(tmp_path):
  marker = tmp_path / 'ran'
  text = ('```tool_code\ncalculator(expression=open(' + repr(str(marker)) +
          ', "w").write("x"))\n```')
  with pytest.raises(calls.Malformed, match='literals'):
    calls.parse('gemma', text)
  assert not marker.exists()


def test_tool_schema_from_the_signature():
  def lookup(city: str, days: int = 1) -> str:
    """The weather.

    More text."""
    return city * days
  tool = tools.describe(lookup)
  assert tool.schema == {'type': 'function', 'function': {
      'name': 'lookup', 'description': 'The weather.',
      'parameters': {'type': 'object', 'properties': {
          'city': {'type': 'string'}, 'days': {'type': 'integer'}},
                     'required': ['city']}}}
  assert tool.signature == 'lookup(city: string, days: integer): The weather.'
  with pytest.raises(TypeError, match='type hint'):
    tools.describe(lambda x: x)


def test_unknown_tool_names_are_config_errors():
  with pytest.raises(UsageError, match="'nope', not a registered tool"):
    tools.get('calculator,nope')


def _run(tool_fns, name, arguments, timeout=1.0):
  by_name = {f.__name__: tools.describe(f) for f in tool_fns}
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    return asyncio.run(tools.run(by_name, name, arguments, timeout, pool))


def slow(seconds: float) -> str:
  time.sleep(seconds)
  return 'done'


def broken(x: int) -> str:
  raise RuntimeError(f'bad {x}')


def test_tool_failures_become_error_results():
  assert _run([slow], 'slow', {'seconds': 0.0}) == tools.Result('done')
  result = _run([slow], 'slow', {'seconds': 2.0}, timeout=0.2)
  assert (result.error, result.text) == (
      'timeout', 'error: slow timed out after 0.2 s')
  assert _run([broken], 'broken', {'x': 3}) == tools.Result(
      'error: RuntimeError: bad 3', 'exception')
  assert _run([broken], 'broken', {'y': 3}).error == 'arguments'
  assert _run([broken], 'broken', {}).error == 'arguments'
  assert _run([broken], 'calc', {}).error == 'unknown'


@pytest.mark.parametrize('expression,value', [
    ('12+30', '42'), ('(2 + 3) * -4', '-20'), ('99999*99999', '9999800001'),
    ('1.5*2', '3.0')])
def test_calculator(expression, value):
  assert tools.calculator(expression) == value


@pytest.mark.parametrize('expression', [
    '__import__("os")', '2**100000', 'x+1', '1/0', '1+', '9' * 201])
def test_calculator_refuses_everything_else(expression):
  with pytest.raises(ValueError):
    tools.calculator(expression)
