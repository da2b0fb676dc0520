"""Agreed preemption: SIGTERM -> a stop at the same phase boundary on every
process -> the job's checkpoint hook -> exit 42 (XPK's JobSet restarts it).

GKE gives a pod `terminationGracePeriodSeconds` (30 s by default) between
SIGTERM and SIGKILL, so jobs check at phase boundaries (after a rollout, after
a train step, after a weight sync), not only at step ends. In multi-controller
runs only some processes may receive SIGTERM; each check is a tiny collective
(a max over processes of the local flag), so all processes stop at the same
check and none steps on alone.

  preemption = Preemption(runtime)          # installs the SIGTERM handler
  for step in ...:
    ... one phase ...
    preemption.check(save=lambda: checkpoint(step))   # raises Preempted

Before a job's first check (config checks, runtime start, model loading,
data preparation, the first step's compilation) there is nothing to
checkpoint: SIGTERM then ends the process at once with one line and exit
42. A thread sees the signal through the signal module's wakeup fd, so this
holds while the main thread is inside a long C call (an XLA compile), where
a Python signal handler would wait. In a multi-controller run this holds
until the processes have connected; from then on a signalled process waits
for the agreed check, so that its peers never wait on a process that left
alone.
"""

from __future__ import annotations

from collections.abc import Callable
import logging
import os
import signal
import socket
import sys
import threading

from jax.experimental import multihost_utils
import numpy as np

from tunix_pw.runtime import backend

EXIT_PREEMPTED = 42


class _Watcher:
  """SIGTERM, as soon as it arrives: before the first check, the exit;
  after it, the flag the checks read."""

  def __init__(self):
    self.event = threading.Event()
    self.armed = False
    self._installed = False

  def install(self) -> None:
    """Idempotent, but the handler is set again each time: a runtime that
    starts in between (jax.distributed's preemption notifier) replaces it."""
    if threading.current_thread() is not threading.main_thread():
      return
    if not self._installed:
      self._installed = True
      reader, writer = socket.socketpair()
      writer.setblocking(False)
      signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
      threading.Thread(target=self._watch, args=(reader, writer),
                       daemon=True, name='sigterm').start()
    # The C handler (which writes the wakeup byte) needs a Python one.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)

  def _watch(self, reader: socket.socket, writer: socket.socket) -> None:
    del writer  # kept alive with this thread
    while data := reader.recv(64):
      if signal.SIGTERM in data:
        self._on_sigterm()

  def _on_sigterm(self) -> None:
    if not self.armed:
      print('SIGTERM before the first step: nothing to checkpoint yet; '
            f'exiting with {EXIT_PREEMPTED} so that the job is restarted',
            file=sys.stderr, flush=True)
      os._exit(EXIT_PREEMPTED)  # pylint: disable=protected-access
    logging.warning('SIGTERM: stopping at the next phase boundary')
    self.event.set()


_WATCHER = _Watcher()


def watch_sigterm() -> None:
  """From now on SIGTERM exits with 42 at once, until a job's first
  preemption check (call it first thing, from the main thread)."""
  _WATCHER.install()


class Preempted(Exception):
  """Raised after the checkpoint hook ran; `main` exits with code 42."""


class Preemption:
  """The SIGTERM flag and the agreed check."""

  def __init__(self, runtime: backend.Runtime):
    self._agree = runtime.backend == backend.MULTI_CONTROLLER
    self._event = _WATCHER.event
    self.checks = 0
    watch_sigterm()
    _WATCHER.armed = self._agree  # peers: stop together (see above)

  def request(self) -> None:
    """Asks for a stop as SIGTERM would (tests, and the job's own reasons)."""
    self._event.set()

  def stop_agreed(self) -> bool:
    """Whether any process was asked to stop. Every process must call this at
    the same points, since it is a collective in multi-controller runs."""
    self.checks += 1
    _WATCHER.armed = True  # from here on a stop can checkpoint
    local = self._event.is_set()
    if not self._agree:
      return local
    flags = multihost_utils.process_allgather(np.array(local, np.int32))
    return bool(np.max(flags))

  def check(self, save: Callable[[], None] | None = None) -> None:
    """At a phase boundary: if a stop is agreed, run `save`, raise Preempted."""
    if self.stop_agreed():
      if save is not None:
        save()
      raise Preempted(f'preempted at check {self.checks}')
