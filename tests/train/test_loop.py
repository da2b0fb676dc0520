"""The loop skeleton's guards: a run of skipped non-finite steps stops the
job; non-finite parameters are never checkpointed."""

import os

import jax
import jax.numpy as jnp
import ml_collections
import optax
import pytest

from tunix_pw.configs import common
from tunix_pw.errors import UsageError
from tunix_pw.runtime import backend
from tunix_pw.train import loop
from tunix_pw.train import step as step_lib

RUNTIME = backend.Runtime(backend.LOCAL, 'test', 0, 1, tuple(jax.devices()))


def test_check_finite_stops_at_the_limit():
  loop.check_finite({'nonfinite_streak': 9.0}, 10, 30)
  loop.check_finite({'nonfinite_streak': 50.0}, 0, 30)  # 0: off
  with pytest.raises(UsageError, match='10 steps in a row up to step 30'):
    loop.check_finite({'nonfinite_streak': 10.0}, 10, 30)


class _Data:

  def state(self):
    return {'position': 3}

  def restore(self, state):
    del state


def test_non_finite_parameters_are_never_checkpointed(tmp_path):
  config = ml_collections.ConfigDict(dict(
      checkpoint=common.checkpointing(every=1), log_every=1, steps=2,
      runtime=common.runtime()))
  state = step_lib.TrainState.create({'w': jnp.ones(3)}, optax.sgd(0.1), 0)
  session = loop.Session('test', config, RUNTIME, str(tmp_path), state,
                         _Data())
  session.save(1)
  session.state = state.replace(params={'w': jnp.array([1.0, jnp.nan, 2.0])})
  with pytest.raises(UsageError, match='parameters at step 2 hold NaN'):
    session.save(2)
  session.close()
  assert os.listdir(tmp_path / 'checkpoints') == ['1']
