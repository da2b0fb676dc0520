"""InflightThrottler on real asynchronous dispatch."""

import jax
import jax.numpy as jnp

from tunix_pw.runtime.throttle import InflightThrottler


@jax.jit
def slow_step(x):
  # Long enough (~0.5 s on a CPU core) that dispatch returns well before.
  for _ in range(12):
    x = jnp.tanh(x @ x) * 0.5
  return x


X = jnp.ones((1024, 1024)) * 1e-3
slow_step(X).block_until_ready()  # compile outside the timing-sensitive part


def test_two_in_flight_then_the_third_waits():
  throttler = InflightThrottler(2)
  first = slow_step(X)
  throttler.add(first)
  assert not first.is_ready()  # add() returned without waiting
  second = slow_step(X)
  # Overlap: the second step is dispatched while the first still runs.
  assert not first.is_ready()
  throttler.add(second)  # two unfinished: blocks until the oldest is done
  assert first.is_ready()
  assert throttler.stats.waits == 1 and throttler.stats.seconds_blocked > 0
  third = slow_step(second)
  throttler.add(third)
  assert second.is_ready()
  throttler.wait_for_all()
  assert throttler.pending == 0 and third.is_ready()
  assert throttler.stats.dispatched == 3


def test_byte_budget_bounds_pending_outputs():
  nbytes = X.nbytes
  throttler = InflightThrottler(max_inflight=10, max_bytes=int(1.5 * nbytes))
  first = slow_step(X)
  throttler.add(first)
  assert throttler.pending == 1
  throttler.add(slow_step(X))  # 2 outputs exceed the budget: wait for one
  assert first.is_ready() and throttler.pending == 1
  throttler.wait_for_all()
  assert throttler.pending == 0


def test_finished_work_is_dropped_without_a_wait():
  throttler = InflightThrottler(1)
  throttler.add(slow_step(X).block_until_ready())
  assert throttler.pending == 0 and throttler.stats.waits == 0
  throttler.add(slow_step(X))  # unfinished, and the bound is 1: a real wait
  assert throttler.pending == 0 and throttler.stats.waits == 1
