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
"""

from __future__ import annotations

from collections.abc import Callable
import logging
import signal
import threading

from jax.experimental import multihost_utils
import numpy as np

from tunix_pw.runtime import backend

EXIT_PREEMPTED = 42


class Preempted(Exception):
  """Raised after the checkpoint hook ran; `main` exits with code 42."""


class Preemption:
  """The SIGTERM flag and the agreed check."""

  def __init__(self, runtime: backend.Runtime):
    self._agree = runtime.backend == backend.MULTI_CONTROLLER
    self._event = threading.Event()
    self.checks = 0
    if threading.current_thread() is threading.main_thread():
      signal.signal(signal.SIGTERM, self._on_sigterm)

  def _on_sigterm(self, signum, frame) -> None:
    del signum, frame
    logging.warning('SIGTERM: stopping at the next phase boundary')
    self._event.set()

  def request(self) -> None:
    """Asks for a stop as SIGTERM would (tests, and the job's own reasons)."""
    self._event.set()

  def stop_agreed(self) -> bool:
    """Whether any process was asked to stop. Every process must call this at
    the same points, since it is a collective in multi-controller runs."""
    self.checks += 1
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
