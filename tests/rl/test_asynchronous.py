"""The rollout thread reads a step's prompts while that step waits for the
weights (Lookahead), and the data positions the steps report stay those of
the batches they took."""

import time

import pytest

from tunix_pw.data import pipeline
from tunix_pw.rl import asynchronous, phases


def reader(num_epochs=None):
  return pipeline.Pipeline([dict(x=i) for i in range(10)],
                           lambda ex, counters: ex['index'], batch_size=4,
                           seed=0, num_epochs=num_epochs)


def test_the_next_prompts_are_read_while_the_weights_are_awaited():
  raw = reader()
  data, taken = asynchronous.Lookahead(raw), []

  def stages(index):
    taken.append(next(data))
    return lambda: phases.Rollout([], [], {})

  rollouts = asynchronous.Rollouts(stages, data, 0, 3, max_staleness=0)
  try:
    first = rollouts.get(0)
    # Step 1 waits for the weights of step 0, not yet published: the
    # thread reads its prompts meanwhile, and the position stays before
    # them.
    deadline = time.monotonic() + 10
    while raw.state() == first.data_after and time.monotonic() < deadline:
      time.sleep(0.01)
    assert raw.state() != first.data_after
    assert data.state() == first.data_after
    assert len(taken) == 1
    rollouts.published(1)
    second = rollouts.get(1)
    rollouts.published(2)
    third = rollouts.get(2)
  finally:
    rollouts.close()
  plain = reader()
  assert taken == [next(plain) for _ in range(3)]
  assert second.data_before == first.data_after
  assert third.data_after == plain.state()


def test_restore_drops_the_batch_read_ahead_and_errors_wait_for_it():
  data = asynchronous.Lookahead(reader(num_epochs=1))
  start = data.state()
  data.read_ahead()
  data.restore(start)
  assert data.state() == start
  assert next(data) == next(reader(num_epochs=1))
  next(data)
  data.read_ahead()  # 10 examples: a third batch of 4 is not there
  data.read_ahead()  # read once
  with pytest.raises(StopIteration):
    next(data)
