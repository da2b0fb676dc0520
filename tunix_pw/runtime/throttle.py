"""InflightThrottler: bounds how many dispatched device computations are in
flight before the controller blocks on the oldest.

JAX dispatch is asynchronous: a controller can queue many train steps or
transfers whose outputs (and temporaries) all hold device memory at once. The
throttler keeps at most `max_inflight` of them (and optionally at most
`max_bytes` of their outputs) unfinished, without serialising the pipeline:
step k+1 is dispatched while step k runs.

  throttler = InflightThrottler(2)
  for batch in data:
    state, metrics = train_step(state, batch)
    throttler.add(metrics)        # blocks while 2 steps are unfinished
  throttler.wait_for_all()
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

import jax


@dataclasses.dataclass
class ThrottleStats:
  dispatched: int = 0
  waits: int = 0  # times the controller had to block
  seconds_blocked: float = 0.0


def _leaves(outputs: Any) -> list[jax.Array]:
  return [x for x in jax.tree.leaves(outputs) if isinstance(x, jax.Array)]


def _nbytes(leaves: list[jax.Array]) -> int:
  # Only this process's shards occupy its devices.
  return sum(s.data.nbytes for x in leaves for s in x.addressable_shards)


class InflightThrottler:
  """At most `max_inflight` unfinished dispatches (and `max_bytes` of their
  outputs, when given)."""

  def __init__(self, max_inflight: int, max_bytes: int | None = None):
    if max_inflight < 1:
      raise ValueError(f'max_inflight must be at least 1, got {max_inflight}')
    self.max_inflight = max_inflight
    self.max_bytes = max_bytes
    self.stats = ThrottleStats()
    self._pending: collections.deque[tuple[list[jax.Array], int]] = (
        collections.deque())

  @property
  def pending(self) -> int:
    return len(self._pending)

  @property
  def pending_bytes(self) -> int:
    return sum(n for _, n in self._pending)

  def add(self, outputs: Any) -> None:
    """Records a dispatched computation by its outputs, then blocks until it
    is allowed to dispatch the next one."""
    leaves = _leaves(outputs)
    self._pending.append((leaves, _nbytes(leaves)))
    self.stats.dispatched += 1
    self._drop_finished()
    while self._pending and (
        len(self._pending) >= self.max_inflight or
        (self.max_bytes is not None and
         self.pending_bytes > self.max_bytes and len(self._pending) > 1)):
      self.wait_for_next()

  def wait_for_next(self) -> None:
    """Blocks until the oldest pending computation is done."""
    if not self._pending:
      return
    leaves, _ = self._pending.popleft()
    if not all(x.is_ready() for x in leaves if not x.is_deleted()):
      start = time.perf_counter()
      jax.block_until_ready([x for x in leaves if not x.is_deleted()])
      self.stats.waits += 1
      self.stats.seconds_blocked += time.perf_counter() - start

  def wait_for_all(self) -> None:
    while self._pending:
      self.wait_for_next()

  def _drop_finished(self) -> None:
    while self._pending and all(
        x.is_deleted() or x.is_ready() for x in self._pending[0][0]):
      self._pending.popleft()
