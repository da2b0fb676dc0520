"""A progress bar for long work, printed by one process only.

On a terminal it redraws one line; in logs (CI, XPK pods, launch/local.py's
prefixed streams) it prints a plain line every tenth of the way instead.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
  """`with Progress(n, 'train') as bar: ... bar.update(loss=0.3)`."""

  def __init__(self, total: int, desc: str, enabled: bool = True,
               stream: TextIO | None = None):
    self.total, self.desc, self.enabled = total, desc, enabled
    self.stream = stream or sys.stderr
    self.done = 0
    self._start = time.perf_counter()
    self._tty = self.stream.isatty()
    self._last_tenth = -1

  def update(self, n: int = 1, **values: float) -> None:
    self.done += n
    if not self.enabled:
      return
    tenth = 10 * self.done // max(self.total, 1)
    if not self._tty and tenth == self._last_tenth:
      return
    self._last_tenth = tenth
    elapsed = time.perf_counter() - self._start
    width = 24
    filled = width * self.done // max(self.total, 1)
    shown = ' '.join(f'{k}={v:.4g}' for k, v in values.items())
    line = (f'{self.desc} [{"#" * filled}{"." * (width - filled)}] '
            f'{self.done}/{self.total} {elapsed:.1f}s {shown}')
    self.stream.write(('\r' + line) if self._tty else line + '\n')
    self.stream.flush()

  def __enter__(self) -> 'Progress':
    return self

  def __exit__(self, *exc) -> None:
    if self.enabled and self._tty:
      self.stream.write('\n')
      self.stream.flush()
