"""Optimizers and learning-rate schedules from a config block."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from tunix_pw.errors import UsageError

SCHEDULES = ('constant', 'cosine')
STATE_DTYPES = {'': None, 'float32': jnp.float32}


def check(block: Any, prefix: str = '--config.optimizer') -> None:
  if block.name not in ('adamw', 'sgd'):
    raise UsageError(f"{prefix}.name={block.name!r} is unknown; use 'adamw' "
                     "or 'sgd'.")
  if block.schedule not in SCHEDULES:
    raise UsageError(f'{prefix}.schedule={block.schedule!r} is unknown; use '
                     f'one of {", ".join(SCHEDULES)}.')
  if block.state_dtype not in STATE_DTYPES:
    raise UsageError(f'{prefix}.state_dtype={block.state_dtype!r} is unknown; '
                     "use '' (the parameters' dtype) or 'float32'.")
  if block.learning_rate <= 0 or block.warmup_steps < 0:
    raise UsageError(f'{prefix}: learning_rate must be positive and '
                     'warmup_steps not negative.')


def make(block: Any, total_steps: int):
  """(optimizer, schedule): warmup then constant or cosine decay to
  `end_fraction` of the peak over `decay_steps` (default: the run's
  steps), gradient clipping by global norm."""
  peak = block.learning_rate
  total_steps = block.get('decay_steps') or total_steps
  warmup = min(block.warmup_steps, max(total_steps - 1, 0))
  if block.schedule == 'cosine':
    schedule = optax.warmup_cosine_decay_schedule(
        0.0 if warmup else peak, peak, warmup, max(total_steps, warmup + 1),
        end_value=peak * block.end_fraction)
  else:
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(
            peak)], [warmup]) if warmup else optax.constant_schedule(peak)
  if block.name == 'adamw':
    core = optax.adamw(schedule, b1=block.b1, b2=block.b2, eps=block.eps,
                       weight_decay=block.weight_decay)
  else:
    core = optax.sgd(schedule)
  chain = [optax.clip_by_global_norm(block.clip_norm)] if block.clip_norm \
      else []
  optimizer = optax.chain(*chain, core)
  dtype = STATE_DTYPES[block.state_dtype]
  return (in_dtype(optimizer, dtype) if dtype else optimizer), schedule


def in_dtype(inner: optax.GradientTransformation,
             dtype: Any) -> optax.GradientTransformation:
  """`inner` with its state, and its arithmetic, in `dtype` (e.g. float32
  moments for bfloat16 parameters); its updates come back in each
  parameter's own dtype."""
  cast = lambda tree: jax.tree.map(lambda x: x.astype(dtype), tree)

  def update(updates, state, params=None):
    new, state = inner.update(cast(updates), state,
                              None if params is None else cast(params))
    return jax.tree.map(lambda n, u: n.astype(u.dtype), new, updates), state

  return optax.GradientTransformation(lambda params: inner.init(cast(params)),
                                      update)
