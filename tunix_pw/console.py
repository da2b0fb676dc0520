"""What a long run says while it works, printed by one process only.

A progress bar shows steps done, their rate (from the second update on, so
that the first step's compilation does not count) and the time left. On a
terminal it redraws one line; in logs (CI, XPK pods, launch/local.py's
prefixed streams) it prints a plain line every `plain_every_s` seconds
(`--config.runtime.progress_every_s`) and at the end instead. `say` prints
a line (an evaluation, a compilation) without tearing a bar that is being
redrawn. `announce_compiles` says when an XLA compilation has run for a
while, and when it ends.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

import jax

_ACTIVE: list['Progress'] = []  # the bar being redrawn, if any
plain_every_s = 60.0


def say(line: str, stream: TextIO | None = None) -> None:
  """Prints `line`; a terminal bar is cleared first and redrawn after."""
  stream = stream or sys.stdout
  bar = next((b for b in _ACTIVE if b.enabled and b.tty), None)
  if bar:
    bar.stream.write('\r\033[K')
    bar.stream.flush()
  print(line, file=stream, flush=True)
  if bar:
    bar.draw()


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  if seconds >= 3600:
    return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m'
  return f'{seconds // 60}m{seconds % 60:02d}s' if seconds >= 60 else (
      f'{seconds}s')


class Progress:
  """`with Progress(n, 'train') as bar: ... bar.update(loss=0.3)`."""

  def __init__(self, total: int, desc: str, enabled: bool = True,
               stream: TextIO | None = None):
    self.total, self.desc, self.enabled = total, desc, enabled
    self.stream = stream or sys.stderr
    self.done, self.values = 0, {}
    self.tty = self.stream.isatty()
    self._start = time.perf_counter()
    self._first: tuple[int, float] | None = None  # (done, when) at update 1
    self._printed = None  # when the last plain line was printed

  def rate(self) -> float | None:
    """Steps per second since the first update (None before a second)."""
    if self._first is None or self.done == self._first[0]:
      return None
    return (self.done - self._first[0]) / max(
        time.perf_counter() - self._first[1], 1e-9)

  def line(self) -> str:
    width, total = 24, max(self.total, 1)
    filled = width * self.done // total
    line = (f'{self.desc} [{"#" * filled}{"." * (width - filled)}] '
            f'{self.done}/{self.total} {time.perf_counter() - self._start:.1f}s')
    if rate := self.rate():
      line += (f' {rate:.3g} steps/s' if rate >= 1 else
               f' {1 / rate:.3g} s/step')
      if self.done < self.total:
        line += f' ETA {_duration((self.total - self.done) / rate)}'
    shown = ' '.join(f'{k}={v:.4g}' for k, v in self.values.items())
    return f'{line} {shown}' if shown else line

  def draw(self) -> None:
    self.stream.write(('\r\033[K' + self.line()) if self.tty else
                      self.line() + '\n')
    self.stream.flush()

  def update(self, n: int = 1, **values: float) -> None:
    """`n` more done; `values` shown from now on (none: the last ones)."""
    self.done += n
    self.values = values or self.values
    now = time.perf_counter()
    if self._first is None:
      self._first = (self.done, now)
    if not self.enabled:
      return
    if not self.tty and self.done < self.total and self._printed is not None \
        and now - self._printed < plain_every_s:
      return
    self._printed = now
    self.draw()

  def __enter__(self) -> 'Progress':
    _ACTIVE.append(self)
    return self

  def __exit__(self, *exc) -> None:
    _ACTIVE.remove(self)
    if self.enabled and self.tty:
      self.stream.write('\n')
      self.stream.flush()


_COMPILE = '/jax/core/compile/backend_compile_duration'


def announce_compiles(after_s: float = 5.0) -> None:
  """From now on, a compilation still running after `after_s` is said
  ('compiling jit(step) ...'), and so is its end with its seconds."""
  running: dict[int, list] = {}  # thread -> [program, start, said]
  lock = threading.Lock()

  def started(event: str, value: float, **kwargs) -> None:
    if event == _COMPILE:
      with lock:
        running[threading.get_ident()] = [
            kwargs.get('fun_name', 'a program'), time.time(), False]

  def ended(event: str, seconds: float, **kwargs) -> None:
    del kwargs
    if event == _COMPILE:
      with lock:
        name, _, said = running.pop(threading.get_ident(), ('', 0, False))
      if said or seconds >= after_s:
        say(f'compiled {name} in {seconds:.1f} s')

  def watch() -> None:
    while True:
      time.sleep(min(after_s, 1.0))
      now = time.time()
      with lock:
        due = [r for r in running.values() if not r[2] and
               now - r[1] >= after_s]
        for r in due:
          r[2] = True
      for name, start, _ in due:
        say(f'compiling {name} ({now - start:.0f} s so far) ...')

  jax.monitoring.register_scalar_listener(started)
  jax.monitoring.register_event_duration_secs_listener(ended)
  threading.Thread(target=watch, daemon=True, name='compiles').start()
