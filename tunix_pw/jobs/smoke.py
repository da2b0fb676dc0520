"""Smoke job: proves the runtime end to end on any backend.

A two-layer regression model trains for `config.steps` jitted, sharded steps
on the actor mesh (at most `runtime.max_inflight` in flight); its parameters
then move to the rollout mesh through the runtime's reshard, where their bits
are checked against the source. Preemption is checked after every step and
after the transfer. Prints a summary and writes it to
`<workdir>/smoke_summary.json`.
"""

from __future__ import annotations

from collections.abc import Callable
import json
import time
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np
from etils import epath

from tunix_pw import console
from tunix_pw import workdir as workdir_lib
from tunix_pw.errors import UsageError
from tunix_pw.runtime import backend, meshes as meshes_lib, reshard, sharding
from tunix_pw.runtime.fetch import fetch
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.runtime.throttle import InflightThrottler

PRESETS = {'tiny': (64, 256), 'wide': (256, 1024)}  # (d_in, d_hidden)
LOGICAL = {'w1': ('embed', 'mlp'), 'w2': ('mlp', 'embed')}


def validate(config: Any) -> None:
  """Static checks: no devices needed."""
  if config.model.preset not in PRESETS:
    raise UsageError(f'--config.model.preset={config.model.preset!r} is '
                     f'unknown; use one of {", ".join(PRESETS)}.')
  if config.steps < 1:
    raise UsageError(f'--config.steps={config.steps} must be at least 1.')
  meshes_lib.check_batch(config.batch_size, config.meshes, 'actor',
                         config.sharding.batch)


def _place(host: np.ndarray, target: NamedSharding) -> jax.Array:
  """A host array (identical on every process) onto a possibly multi-process
  sharding: each process fills only its own shards."""
  return jax.make_array_from_callback(host.shape, target, lambda i: host[i],
                                      dtype=host.dtype)


def _loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array):
  hidden = jnp.tanh(jnp.einsum('BD,DH->BH', x, params['w1']))
  return jnp.mean((jnp.einsum('BH,HD->BD', hidden, params['w2']) - y) ** 2)


def _bitsum(tree: Any) -> jax.Array:
  """An order-independent exact checksum of a tree's bits (uint32 sums wrap)."""
  leaves = [jax.lax.bitcast_convert_type(x, jnp.uint32).sum(dtype=jnp.uint32)
            for x in jax.tree.leaves(tree)]
  return sum(leaves, jnp.uint32(0))


def _problem(config: Any, mesh: Any) -> tuple[dict[str, Any], ...]:
  """A teacher-student regression on `mesh`: (params, x, y)."""
  d_in, d_hidden = PRESETS[config.model.preset]
  shapes = {'w1': (d_in, d_hidden), 'w2': (d_hidden, d_in)}
  rng = np.random.default_rng(config.seed)
  host = {k: (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
          for k, s in shapes.items()}
  teacher = rng.standard_normal((d_in, d_in)).astype(np.float32) / d_in**0.5
  x_host = rng.standard_normal((config.batch_size, d_in)).astype(np.float32)
  batch_sh = sharding.batch(mesh, x_host.shape, config.sharding)
  params = {k: _place(v, _shardings(config, mesh)[k]) for k, v in host.items()}
  return (params, _place(x_host, batch_sh),
          _place(np.tanh(x_host @ teacher), batch_sh))


def _shardings(config: Any, mesh: Any) -> dict[str, Any]:
  d_in, d_hidden = PRESETS[config.model.preset]
  shapes = {'w1': (d_in, d_hidden), 'w2': (d_hidden, d_in)}
  return {k: sharding.named(mesh, s, LOGICAL[k], config.sharding)
          for k, s in shapes.items()}


def _train(config: Any, runtime: backend.Runtime, actor: Any, workdir: str,
           preemption: Preemption) -> tuple[Any, list[float], float, int,
                                            Callable[[], None]]:
  """SGD steps, at most max_inflight in flight: (params, losses, seconds
  per step, throttler waits, the checkpoint save)."""
  params, x, y = _problem(config, actor)
  replicated = NamedSharding(actor, PartitionSpec())
  lr = config.learning_rate

  def train_step(params, x, y):
    loss, grads = jax.value_and_grad(_loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss

  train_step = jax.jit(train_step, donate_argnums=0,
                       out_shardings=(_shardings(config, actor), replicated))
  bitsum = jax.jit(_bitsum, out_shardings=replicated)
  throttler = InflightThrottler(config.runtime.max_inflight)
  losses = []

  def save() -> None:
    """The smoke job's checkpoint: one line per save, with the step and the
    state's bits, in a file per process."""
    record = json.dumps(dict(step=len(losses),
                             checksum=int(fetch(bitsum(params)))))
    workdir_lib.append_text(workdir_lib.path(
        workdir, workdir_lib.smoke_checkpoint(runtime.process_index)),
                            record + '\n')

  start = time.perf_counter()
  with console.Progress(config.steps, 'smoke',
                        enabled=runtime.is_coordinator) as bar:
    for _ in range(config.steps):
      params, loss = train_step(params, x, y)
      losses.append(loss)
      throttler.add(loss)  # the loss is never donated: a safe marker
      bar.update()
      preemption.check(save)
  throttler.wait_for_all()
  seconds = (time.perf_counter() - start) / config.steps
  return (params, [float(v) for v in fetch(losses)], seconds,
          throttler.stats.waits, save)


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  actor, rollout = meshes['actor'], meshes['rollout']
  params, losses, step_seconds, waits, save = _train(
      config, runtime, actor, workdir, preemption)
  source_bits = int(fetch(jax.jit(
      _bitsum, out_shardings=NamedSharding(actor, PartitionSpec()))(params)))
  moved, stats = reshard.transfer(
      params, _shardings(config, rollout), runtime,
      budget=reshard.Budget.from_block(config.runtime))
  moved_bits = int(fetch(jax.jit(
      _bitsum, out_shardings=NamedSharding(rollout, PartitionSpec()))(moved)))
  if moved_bits != source_bits:
    raise RuntimeError(f'transferred parameters differ from the source '
                       f'(bit checksum {moved_bits} != {source_bits})')
  preemption.check(save)

  summary = dict(
      backend=runtime.backend,
      processes=runtime.process_count,
      devices=len(runtime.devices),
      meshes=meshes.describe(),
      losses=losses,
      step_seconds=step_seconds,
      throttle_waits=waits,
      transfer=stats.metrics('transfer'),
      checksum=source_bits,
  )
  if runtime.is_coordinator:
    (epath.Path(workdir) / workdir_lib.SMOKE_SUMMARY).write_text(
        json.dumps(summary, indent=2))
    print(f'smoke: {runtime.backend} backend, {runtime.process_count} '
          f'process(es), {len(runtime.devices)} devices; {meshes.describe()}\n'
          f'smoke: loss {losses[0]:.5f} -> {losses[-1]:.5f}, median step '
          f'{step_seconds * 1e3:.2f} ms per step; transfer by {stats.path} in '
          f'{stats.seconds * 1e3:.2f} ms, values verified')
