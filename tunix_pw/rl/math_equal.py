"""Math answer equivalence for the `math_equal` reward: the final answer of
a completion against the reference, as a grader would judge it.

`final_answer` takes the last `\\boxed{...}` (else the text after the last
'answer is', else the whole text); `normalise` strips what does not change
a value (dollar signs, `\\left`/`\\right`, `\\text{...}` units and unit
words, percent signs, degrees, thousands separators, a leading `x =`);
`equal` compares the normalised strings, then the numbers, then, through
sympy, the expressions (simple LaTeX: `\\frac`, `\\sqrt`, `^`, `\\cdot`,
`\\pi`), within a time limit (TimeoutError past it: the reward machinery
counts it and scores 0). sympy runs in a helper process of its own, with
its memory capped: neither a signal nor a thread can stop a long C-level
step (an expansion of `(x+1)^(10^6)` grew a test process to 22 GB), and
rewards run on the scoring thread of asynchronous RL, where no signal
arrives.
"""

from __future__ import annotations

import json
import re
import resource
import select
import subprocess
import sys
import threading

import sympy
from sympy.parsing import sympy_parser

TIME_LIMIT_S = 2.0
_TRANSFORMS = (sympy_parser.standard_transformations +
               (sympy_parser.implicit_multiplication_application,
                sympy_parser.convert_xor))
_UNITS = ('dollars', 'dollar', 'cents', 'cm', 'km', 'kg', 'mm', 'meters',
          'metres', 'meter', 'm', 'g', 'hours', 'hour', 'minutes', 'min',
          'seconds', 'sec', 's', 'degrees', 'units', 'inches', 'feet', 'ft',
          'miles', 'mph', 'pounds', 'lbs', 'people', 'students', 'days')
_UNIT = re.compile(r'\s*\b(?:' + '|'.join(_UNITS) + r')\b\.?\s*$')
_THOUSANDS = re.compile(r'(?<![\d.])(\d{1,3})((?:,\d{3})+)(?![\d])')


def _braced(text: str, start: int) -> tuple[str, int] | None:
  """The content of the brace group opening at `start`, and its end."""
  depth = 0
  for i in range(start, len(text)):
    depth += {'{': 1, '}': -1}.get(text[i], 0)
    if depth == 0:
      return text[start + 1:i], i + 1
  return None


def final_answer(text: str) -> str:
  """The last \\boxed{} content, else what follows the last 'answer is',
  else the text."""
  at = text.rfind('\\boxed')
  if at >= 0:
    brace = text.find('{', at)
    found = brace >= 0 and _braced(text, brace)
    if found:
      return found[0]
  match = list(re.finditer(r'answer is[:\s]*', text, re.IGNORECASE))
  if match:
    return text[match[-1].end():].strip().rstrip('.')
  return text


def normalise(text: str) -> str:
  s = final_answer(text) if '\\boxed' in text else text
  s = s.strip().strip('$').strip()
  s = re.sub(r'\\(?:left|right|displaystyle|!|,|;|:)', '', s)
  s = re.sub(r'\\(?:d|t)frac', r'\\frac', s)
  s = re.sub(r'\\text\{[^{}]*\}|\\mbox\{[^{}]*\}', '', s)
  s = re.sub(r'\^\{?\\circ\}?|°', '', s)
  s = s.replace('\\%', '').replace('%', '').replace('\\$', '')
  s = re.sub(r'^[a-zA-Z]\s*=\s*', '', s)  # x = 3 -> 3
  s = _UNIT.sub('', s).strip().rstrip('.').strip()
  s = _THOUSANDS.sub(lambda m: m.group(1) + m.group(2).replace(',', ''), s)
  return s.replace(' ', '')


def _to_python(s: str) -> str:
  """Simple LaTeX as a sympy-parsable expression."""
  for _ in range(8):  # nested \frac and \sqrt, innermost last
    s = re.sub(r'\\frac\{([^{}]*)\}\{([^{}]*)\}', r'((\1)/(\2))', s)
    s = re.sub(r'\\frac(\d)(\d)', r'((\1)/(\2))', s)
    s = re.sub(r'\\sqrt\[([^\]]*)\]\{([^{}]*)\}', r'((\2)**(1/(\1)))', s)
    s = re.sub(r'\\sqrt\{([^{}]*)\}', r'sqrt(\1)', s)
    s = re.sub(r'\\sqrt(\d+)', r'sqrt(\1)', s)
  s = s.replace('\\cdot', '*').replace('\\times', '*').replace('\\pi', 'pi')
  return s.replace('{', '(').replace('}', ')').replace('\\', '')


MEMORY_BYTES = 1 << 30  # the helper's address space


class _Helper:
  """The helper process: started on first use, replaced after a timeout
  or a crash; one check at a time."""

  def __init__(self):
    self._lock = threading.Lock()
    self._proc: subprocess.Popen | None = None

  def equal(self, a: str, b: str, seconds: float) -> bool:
    with self._lock:
      if self._proc is None:  # its start (sympy's import) is not timed
        self._proc = subprocess.Popen(
            [sys.executable, '-c',
             'from tunix_pw.rl import math_equal; math_equal.serve()'],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._proc.stdout.readline()
      self._proc.stdin.write(json.dumps([a, b]) + '\n')
      self._proc.stdin.flush()
      if not select.select([self._proc.stdout], [], [], seconds)[0]:
        self._stop()
        raise TimeoutError(f'the equivalence check took over {seconds} s')
      line = self._proc.stdout.readline()
      if not line:
        self._stop()
        raise RuntimeError('the equivalence check crashed')
      verdict = json.loads(line)
      if verdict is None:
        raise MemoryError('the equivalence check ran out of memory')
      return verdict

  def _stop(self) -> None:
    self._proc.kill()
    self._proc.wait()
    self._proc = None


_helper = _Helper()


def serve() -> None:
  """The helper's loop: a JSON pair per line in, `true`/`false` (or `null`
  out of memory) per line out."""
  resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
  print('ready', flush=True)
  for line in sys.stdin:
    try:
      verdict = _sympy_equal(*json.loads(line))
    except MemoryError:
      verdict = None
    print(json.dumps(verdict), flush=True)


def _sympy_equal(a: str, b: str) -> bool:
  try:
    left, right = (sympy_parser.parse_expr(_to_python(s),
                                           transformations=_TRANSFORMS,
                                           evaluate=True) for s in (a, b))
    return bool(sympy.simplify(left - right) == 0)
  except MemoryError:
    raise
  except Exception:  # pylint: disable=broad-exception-caught
    return False  # not an expression sympy reads: not equal


def _number(s: str) -> float | None:
  try:
    return float(s)
  except ValueError:
    return None


def equal(answer: str, reference: str,
          time_limit_s: float | None = None) -> bool:
  """Whether two final answers denote the same value (sympy's part within
  `time_limit_s`, default TIME_LIMIT_S)."""
  a, b = normalise(answer), normalise(reference)
  if not a or not b:
    return False
  if a == b:
    return True
  x, y = _number(a), _number(b)
  if x is not None and y is not None:
    return abs(x - y) <= 1e-6 * max(1.0, abs(y))
  # A timeout or a memory blow-up raises: the reward counts it as an error
  # and scores 0.
  return _helper.equal(a, b, time_limit_s or TIME_LIMIT_S)
