"""PPO's critic: a value model (`models/value.py`) trained beside the
policy, on its own role mesh (`critic`) or the actor's, and the per-token
advantages it gives (GAE over token rewards: the sequence's reward on its
last token, with the KL penalty on every token when it is a reward).

Its decoder is the policy's initial model (`--config.critic.init=policy`,
loaded again onto the critic's mesh) or any model block
(`init=model`: `--config.critic.model`), with a fresh value head.
"""

from __future__ import annotations

import functools
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from tunix_pw.models import blocks, checkpoints, decoder, value
from tunix_pw.rl import functions, phases
from tunix_pw.rl import plan as plan_lib
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.train import plans, program, setup

INITS = ('policy', 'model')
BATCH = phases.SEQUENCES + ('loss_mask', 'weights', 'returns', 'old_values')


def mesh(meshes: Any) -> Any:
  return meshes['critic'] if 'critic' in meshes.by_role else meshes['actor']


def model_block(config: Any) -> Any:
  return config.model if config.critic.init == 'policy' else (
      config.critic.model)


def loss(model, batch, rng, *, clip: float, shard: Sharder = Sharder()):
  """The clipped value loss over completion tokens, summed, with the token
  count as the weight (the train step averages)."""
  del rng
  values = model(batch['tokens'], batch['positions'], batch['segment_ids'],
                 shard)[:, :-1]
  mask = batch['loss_mask'][:, 1:] * batch['weights'][:, None]
  per_token, clipped = functions.value_loss(values, batch['old_values'],
                                            batch['returns'], clip)
  return (per_token * mask).sum(), dict(
      weight=mask.sum(), value_clip_fraction=(clipped * mask).sum(),
      value_mean=(values * mask).sum())


def abstract_model(block: Any, seed: int, on: Any,
                   rules: Any) -> value.ValueModel:
  """A value model on `block`'s decoder as shapes on mesh `on`: what
  `build` makes, unallocated."""
  cfg = blocks.architecture(block)
  model = nnx.eval_shape(lambda: value.ValueModel(decoder.Decoder(
      cfg, rngs=nnx.Rngs(seed), **checkpoints.model_kwargs(block)),
                                                  rngs=nnx.Rngs(seed)))
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, plans.on_mesh(state, on, rules))


def build(config: Any, meshes: Any, *, abstract: bool) -> program.Program:
  """The critic and its train step on its mesh (from shapes for a
  compile-only check)."""
  rl, on = config.rl, mesh(meshes)
  if abstract:
    model = abstract_model(model_block(config), config.seed, on,
                           config.sharding)
  else:
    base, _ = setup.model_from_block(model_block(config), seed=config.seed,
                                     mesh=on, rules=config.sharding)
    model = value.from_decoder(base, config.seed, on, config.sharding)
  return program.from_model(
      model, on, functools.partial(loss, clip=config.critic.value_clip,
                                   shard=Sharder(on, config.sharding)),
      use_lora=False, optimizer=config.critic.optimizer, seed=config.seed,
      micro_batches=rl.mini_batch_size // rl.micro_batch_size,
      total_updates=plan_lib.total_updates(config), abstract=abstract,
      unroll_on_cpu=model_block(config).unroll_cpu_train,
      init=setup.init_program(model_block(config), seed=config.seed, mesh=on,
                              rules=config.sharding))


def values_program(config: Any, critic: program.Program):
  """jitted (critic params, sequences) -> values [N, T - 1], aligned with
  the policy's token log-probabilities."""
  shard = Sharder(critic.mesh, config.sharding)
  return jax.jit(lambda params, b: nnx.merge(critic.graphdef, params)(
      b['tokens'], b['positions'], b['segment_ids'], shard)[:, :-1])


def token_rewards(result: phases.Rollout, arrays: dict[str, np.ndarray],
                  logps: dict[str, np.ndarray], rl: Any) -> np.ndarray:
  """[N, T - 1]: each sample's reward on its last completion token, minus
  kl_beta (log pi_old - log pi_ref) on every completion token when the KL
  is a reward penalty (`--config.rl.kl_in_reward`)."""
  mask = arrays['loss_mask'][:, 1:].astype(np.float32)
  rewards = np.zeros_like(mask)
  last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)
  rewards[np.arange(len(mask)), last] = np.concatenate(
      [g.rewards for g in result.groups])
  if rl.kl_in_reward and rl.kl_beta:
    rewards -= rl.kl_beta * (logps['old_logps'] - logps['ref_logps']) * mask
  return rewards


def advantages(rewards: np.ndarray, values: np.ndarray,
               arrays: dict[str, np.ndarray], rl: Any):
  """(advantages, returns) [N, T - 1] by GAE over the completion tokens of
  the samples that count (weight > 0); advantages whitened over the batch
  with `--config.rl.whiten_advantages`."""
  mask = jnp.asarray(arrays['loss_mask'][:, 1:] *
                     (arrays['weights'][:, None] > 0), jnp.float32)
  adv, returns = functions.gae(jnp.asarray(rewards), jnp.asarray(values),
                               mask, rl.gamma, rl.lam)
  if rl.whiten_advantages:
    adv = functions.whiten(adv, mask)
  return np.asarray(adv, np.float32), np.asarray(returns, np.float32)
