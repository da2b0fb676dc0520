"""The math_equal reward: final answers equal by value, not by spelling
(and not equal when they differ), each check within a time limit."""

import json
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tunix_pw.rl import math_equal, rewards

EQUAL = [
    ('3', '3'), ('3.0', '3'), ('0.5', '\\frac{1}{2}'), ('1/2', '0.5'),
    ('\\frac12', '0.5'), ('\\dfrac{3}{4}', '0.75'), ('1,000', '1000'),
    ('1,234,567', '1234567'), ('x=3', '3'), ('x = -2', '-2'),
    ('$5', '5'), ('\\$5.00', '5'), ('50\\%', '50'), ('50%', '50'),
    ('12 dollars', '12'), ('7 cm', '7'), ('90^\\circ', '90'),
    ('90°', '90'), ('12 \\text{apples}', '12'), ('\\boxed{42}', '42'),
    ('\\sqrt{4}', '2'), ('\\sqrt{8}', '2\\sqrt{2}'), ('2^3', '8'),
    ('2^{10}', '1024'), ('\\frac{\\sqrt{3}}{2}', '\\sqrt{3}/2'),
    ('3\\cdot 4', '12'), ('6 \\times 7', '42'), ('\\pi', 'pi'),
    ('2\\pi', '\\pi*2'), ('-\\frac{2}{4}', '-0.5'), ('1e3', '1000'),
    ('0.3333333333', '0.33333333331'), ('\\left(\\frac{1}{3}\\right)', '1/3'),
    ('x+x', '2x'), ('(x+1)^2', 'x^2+2x+1'), ('10.', '10'),
    ('\\sqrt[3]{27}', '3'), ('\\frac{\\frac{1}{2}}{2}', '0.25'),
]
NOT_EQUAL = [
    ('3', '4'), ('0.5', '\\frac{1}{3}'), ('1,000', '100'), ('x=3', '4'),
    ('-2', '2'), ('\\sqrt{2}', '1.414'), ('2^3', '9'), ('x+1', 'x'),
    ('12', '1,2'), ('', '3'), ('banana', '3'), ('\\frac{1}{0}', '1'),
    ('101', '100'), ('3.01', '3'),
]


@pytest.mark.parametrize('answer, reference', EQUAL)
def test_equal(answer, reference):
  assert math_equal.equal(answer, reference)
  assert math_equal.equal(reference, answer)


@pytest.mark.parametrize('answer, reference', NOT_EQUAL)
def test_not_equal(answer, reference):
  assert not math_equal.equal(answer, reference)


def test_final_answer_is_the_last_box_or_what_follows_answer_is():
  assert math_equal.final_answer(
      'First \\boxed{1}, then \\boxed{\\frac{3}{4}} done') == '\\frac{3}{4}'
  assert math_equal.final_answer('So the answer is 17.') == '17'
  assert math_equal.final_answer('42') == '42'


def test_the_reward_on_samples():
  def sample(completion, answer):
    return rewards.Sample('q', completion, answer, 5, 10, False)
  assert rewards.math_equal(sample('We get \\boxed{0.5}', '\\frac{1}{2}')) == 1
  assert rewards.math_equal(sample('The answer is 1,000', '1000')) == 1
  assert rewards.math_equal(sample('\\boxed{3}', '4')) == 0


def test_the_limits_hold_off_the_main_thread_and_memory_stays_out():
  """On the scoring thread of asynchronous RL (no signals there), a slow
  check still times out; a memory blow-up ends in the helper process."""
  outcome = []
  thread = threading.Thread(target=lambda: outcome.append(pytest.raises(
      TimeoutError, math_equal.equal, '(x+1)^(10^6)', 'x', time_limit_s=0.2)))
  start = time.monotonic()
  thread.start()
  thread.join(timeout=10)
  assert outcome and time.monotonic() - start < 5
  before = psutil.Process().memory_info().rss
  with pytest.raises(MemoryError):  # given the time, it outgrows its cap
    math_equal.equal('(x+1)^(10^6)', 'x', time_limit_s=60)
  assert psutil.Process().memory_info().rss - before < 100 * 2**20
  assert math_equal.equal('\\frac{1}{2}', '0.5')  # a fresh helper


def test_a_slow_check_times_out_and_is_counted_by_the_reward(monkeypatch):
  start = time.monotonic()
  with pytest.raises(TimeoutError):
    math_equal.equal('(x+1)^(10^6)', 'x', time_limit_s=0.2)
  assert time.monotonic() - start < 5
  monkeypatch.setattr(math_equal, 'TIME_LIMIT_S', 0.2)
  scores, _, errors = rewards.score(
      [rewards.Sample('q', '\\boxed{(x+1)^(10^6)}', 'x', 5, 10, False),
       rewards.Sample('q', '\\boxed{2}', '2', 5, 10, False)],
      [('math_equal', 1.0)], strict=False)
  assert errors == 1 and list(scores) == [0.0, 1.0]


def payloads(target):
  """Answers that try to run code: each would create `target` (or read
  the host) if any part of the check evaluated it."""
  t = repr(str(target))
  touch = repr(f'touch {target}')
  return [
      f"Symbol.__new__.__globals__['__builtins__']['open']({t},'w')",
      f"__import__('os').system({touch})",
      f"__import__(chr(111)+chr(115)).system({touch})",
      f"getattr(__import__('o'+'s'),'sys'+'tem')({touch})",
      f"(lambda: open({t},'w'))()",
      f"exec(\"open({t},'w')\")",
      f"eval(\"open({t},'w')\")",
      f"open({t},'w').write('x')",
      f"__builtins__.open({t},'w')",
      f"getattr(__builtins__,'open')({t},'w')",
      f"globals()['__builtins__']['open']({t},'w')",
      f"[c for c in ().__class__.__base__.__subclasses__() if c.__name__=="
      f"'Popen'][0](['touch',{t}])",
      f"__import__('subprocess').run(['touch',{t}])",
      f"__import__('shutil').copy('/etc/hostname',{t})",
      f"compile(\"open({t},'w')\",'a','exec')",
      f"sympify(\"open({t},'w')\")",
      f"parse_expr(\"open({t},'w')\")",
      f"Integer.__init_subclass__.__globals__['__builtins__']['exec']("
      f"\"open({t},'w')\")",
      f"\\frac{{__import__('os').system({touch})}}{{2}}",
      f"x.__class__.__mro__[-1].__subclasses__()[0]({t})",
      f"exec(bytes([111,112,101,110]).decode()+\"({t},'w')\")",
      f"$\\boxed{{open({t},'w')}}$",
      f"2 + __import__('os').system({touch})",
      f"(x:=__import__('os')).system({touch})",
  ]


def test_answers_that_try_to_run_code_run_nothing(tmp_path):
  """Through the registered reward in a fresh process, as RL scores them:
  none is equal and none leaves a file behind."""
  target = tmp_path / 'pwned'
  answers = payloads(target)
  assert len(answers) >= 21
  script = (
      'import json, sys\n'
      'from tunix_pw.rl import rewards\n'
      'scores = [rewards.math_equal(rewards.Sample("q", f"\\\\boxed{{{a}}}" '
      'if i % 2 else a, "3", 5, 10, False)) for i, a in '
      'enumerate(json.load(sys.stdin))]\n'
      'print(json.dumps(scores))\n')
  done = subprocess.run([sys.executable, '-c', script], cwd=tmp_path,
                        input=json.dumps(answers), capture_output=True,
                        text=True, timeout=120, check=True)
  assert json.loads(done.stdout.splitlines()[-1]) == [0.0] * len(answers)
  assert not target.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize('text', [
    'a' + ' ' * 64000 + 'x', ' ' * 65536, '\t\n ' * 20000,
    '(' * 64000, '{' * 32000 + '}' * 32000, '\\boxed{' * 9000,
    '\\frac{' * 9000, '-' * 64000, '1,' * 30000 + '1', '9' * 64000,
    'answer is ' * 6000, '\\sqrt' * 12000, '^' * 64000])
def test_long_or_nested_answers_are_scored_within_the_limit(text):
  assert math_equal.equal('x+1', '1+x')  # the helper started, untimed
  start = time.monotonic()
  assert not math_equal.equal(text, '3')
  assert math_equal.final_answer(text) is not None
  assert time.monotonic() - start < math_equal.TIME_LIMIT_S
