"""Math answer equivalence for the `math_equal` reward: the final answer of
a completion against the reference, as a grader would judge it.

`final_answer` takes the last `\\boxed{...}` (else the text after the last
'answer is', else the whole text); `normalise` strips what does not change
a value (dollar signs, `\\left`/`\\right`, `\\text{...}` units and unit
words, percent signs, degrees, thousands separators, a leading `x =`);
`equal` compares the normalised strings, then the numbers, then the
expressions (LaTeX: `\\frac`, `\\sqrt`, `^`, `\\cdot`, `\\pi`, functions)
within a time limit (TimeoutError past it: the reward machinery counts it
and scores 0).

The answer is a model's text, so nothing here evaluates it: expressions
are parsed by latex2sympy2_extended's ANTLR grammar, which builds sympy
objects node by node (never `eval`, unlike sympy's `parse_expr`), and
answers over `MAX_CHARS` are compared as strings and numbers only. The
parse and sympy's simplification run in a helper process with its memory
capped: neither a signal nor a thread can stop a long C-level step (an
expansion of `(x+1)^(10^6)` grew a test process to 22 GB), and rewards run
on the scoring thread of asynchronous RL, where no signal arrives. Once
warmed up, the helper refuses, through an audit hook, to compile, execute
or import code, to open files, or to use the os, socket and subprocess
modules: were a parser ever to reach `eval`, nothing would run.
"""

from __future__ import annotations

import json
import re
import resource
import select
import subprocess
import sys
import threading

TIME_LIMIT_S = 2.0
MAX_CHARS = 1000  # longer answers: compared as strings and numbers only
_UNITS = ('dollars', 'dollar', 'cents', 'cm', 'km', 'kg', 'mm', 'meters',
          'metres', 'meter', 'm', 'g', 'hours', 'hour', 'minutes', 'min',
          'seconds', 'sec', 's', 'degrees', 'units', 'inches', 'feet', 'ft',
          'miles', 'mph', 'pounds', 'lbs', 'people', 'students', 'days')
# Anchored at the end and matched on stripped text: with `\s*` on both
# sides, a long run of spaces took quadratic time.
_UNIT = re.compile(r'\b(?:' + '|'.join(_UNITS) + r')\.?$')
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
  s = _UNIT.sub('', s.rstrip()).strip().rstrip('.').strip()
  s = _THOUSANDS.sub(lambda m: m.group(1) + m.group(2).replace(',', ''), s)
  return s.replace(' ', '')


_BARE_PI = re.compile(r'(?<![\\a-zA-Z])pi(?![a-zA-Z])')


def _numeral(text: str):
  """A number token as a sympy number, without sympify (which `eval`s)."""
  import sympy  # pylint: disable=g-import-not-at-top (the helper's)
  text = text.replace(',', '').replace(' ', '')
  try:
    return sympy.Integer(int(text))
  except ValueError:
    return sympy.Float(text)  # mpmath reads it: no eval either


def _eval_free_parser() -> None:
  """latex2sympy2_extended makes numbers from token text with
  `sympy.Number(str)`, which goes through sympify's `eval`: its two places
  that do take `_numeral` instead (in the helper process only)."""
  from latex2sympy2_extended import latex2sympy2  # pylint: disable=g-import-not-at-top
  latex2sympy2.Number = _numeral  # convert_number's
  latex2sympy2._Latex2Sympy.parse_number = (  # pylint: disable=protected-access
      lambda self, text: _numeral(text))


def _expression(latex: str):
  """A sympy expression parsed from `latex` (ANTLR, no eval); raises on
  text that is not one."""
  from latex2sympy2_extended import latex2sympy  # pylint: disable=g-import-not-at-top (the helper's)
  from latex2sympy2_extended.math_normalization import NormalizationConfig  # pylint: disable=g-import-not-at-top
  return latex2sympy(
      _BARE_PI.sub(r'\\pi', latex),
      normalization_config=NormalizationConfig(
          basic_latex=True, malformed_operators=True, boxed='none'))


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


_WARM_UP = (('\\frac{1}{2}', '0.5'), ('\\sqrt{8}', '2\\sqrt{2}'),
            ('(x+1)^2', 'x^2+2x+1'), ('\\sin^2(x)+\\cos^2(x)', '1'),
            ('\\log(8)', '3\\log(2)'), ('\\sqrt[3]{27}', '3'),
            ('1,2', '12'), ('x=3', '3'), ('2^{10}', '1024'))
_REFUSED = {'compile', 'exec', 'import', 'open', 'builtins.input',
            'code.__new__', 'function.__new__'}
_REFUSED_PREFIXES = ('os.', 'subprocess.', 'socket.', 'shutil.', 'ctypes.',
                     'pty.', 'urllib.', 'http.', 'ftplib.', 'smtplib.',
                     'webbrowser.', 'sqlite3.')


def _refuse(event: str, _) -> None:
  """The audit hook: raises for code, imports and I/O, except sympy's own
  code generation for polynomial rings (its text depends on the number
  of variables only, never on the answer's)."""
  if event in _REFUSED or event.startswith(_REFUSED_PREFIXES):
    if event in ('compile', 'exec') and sys._getframe(1).f_code.co_filename \
        == _MONOMIAL_CODE[0]:  # pylint: disable=protected-access
      return
    raise PermissionError(f'the equivalence check may not {event}')


_MONOMIAL_CODE = ['']  # sympy/polys/monomials.py, once the helper starts


def serve() -> None:
  """The helper's loop: a JSON pair per line in, `true`/`false` (or `null`
  out of memory) per line out. Its imports are done before the first
  answer arrives; from then on the audit hook refuses code and I/O."""
  resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
  _eval_free_parser()
  from sympy.polys import monomials  # pylint: disable=g-import-not-at-top
  _MONOMIAL_CODE[0] = monomials.__file__
  for a, b in _WARM_UP:  # sympy and the parser import what they use
    _sympy_equal(a, b)
  sys.addaudithook(_refuse)
  print('ready', flush=True)
  for line in sys.stdin:
    try:
      verdict = _sympy_equal(*json.loads(line))
    except MemoryError:
      verdict = None
    print(json.dumps(verdict), flush=True)


def _sympy_equal(a: str, b: str) -> bool:
  import sympy  # pylint: disable=g-import-not-at-top (the helper's)
  try:
    left, right = _expression(a), _expression(b)
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
  if max(len(a), len(b)) > MAX_CHARS:
    return False
  # A timeout or a memory blow-up raises: the reward counts it as an error
  # and scores 0.
  return _helper.equal(a, b, time_limit_s or TIME_LIMIT_S)
