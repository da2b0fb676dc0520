"""PPO with a critic: the GRPO family's rollout, log-probability and update
phases, with per-token advantages from a learned value model.

A step: rollout and rewards -> reference and old log-probabilities -> the
critic's values -> token rewards (the sequence reward on the last token;
the KL penalty on every token when `rl.kl_in_reward`) -> GAE (gamma,
lambda) and whitening -> the policy's clipped updates (skipped during
`critic.warmup_steps`, with an entropy bonus and the KL as a loss when it
is not a reward) -> the critic's clipped value updates -> weight sync.
The checkpoint holds both train states.
"""

from __future__ import annotations

from collections.abc import Callable
import functools
from typing import Any

import flax
from flax import nnx

from tunix_pw.errors import UsageError
from tunix_pw.models import checkpoints
from tunix_pw.rl import config_checks, critic as critic_lib, functions
from tunix_pw.rl import phases, plan as plan_lib, trainer
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.fetch import fetch
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.train import optim, plans, program, setup
from tunix_pw.train.step import TrainState


@flax.struct.dataclass
class State:
  policy: TrainState
  critic: TrainState

  @property
  def params(self):
    """The policy's (what the rollout engine serves)."""
    return self.policy.params


def validate(config: Any) -> None:
  rl, block = config.rl, config.critic
  source = functions.token_advantage(rl.advantage)
  if source is None or source.scorer != 'critic':
    raise UsageError(f'--config.rl.advantage={rl.advantage!r}: PPO\'s '
                     'advantages are its critic\'s; use gae (or '
                     'tunix_pw/configs/grpo.py for group advantages).')
  config_checks.validate(config)
  if not (0 <= rl.gamma <= 1 and 0 <= rl.lam <= 1):
    raise UsageError(f'--config.rl.gamma={rl.gamma} and lam={rl.lam} must '
                     'lie in [0, 1].')
  if block.init not in critic_lib.INITS:
    raise UsageError(f'--config.critic.init={block.init!r} is unknown; use '
                     f'one of {", ".join(critic_lib.INITS)}.')
  if block.init == 'model':
    checkpoints.check_model_block(block.model, '--config.critic.model')
  if block.value_clip < 0 or block.warmup_steps < 0:
    raise UsageError(f'--config.critic.value_clip={block.value_clip} and '
                     f'warmup_steps={block.warmup_steps} must be >= 0.')
  optim.check(block.optimizer, '--config.critic.optimizer')
  if 'critic' in config.meshes:
    meshes_lib.check_batch(rl.micro_batch_size, config.meshes, 'critic',
                           config.sharding.batch,
                           '--config.rl.micro_batch_size')


def critic_values(parts: trainer.Parts, critic: program.Program,
                  values: Callable, state: State,
                  arrays: dict[str, Any]) -> Any:
  rules = parts.config.sharding
  return fetch(phases.chunked_logps(
      values, nnx.state(critic.model(state.critic.params)), arrays,
      critic.mesh, rules, parts.config.rl.logps_micro_batch_size))


def step(parts: trainer.Parts, state: State, index: int,
         result: phases.Rollout, timer: phases.Timer, preemption: Preemption,
         stop: Callable[[], None], *, critic: program.Program,
         values: Callable) -> tuple[State, dict[str, float]]:
  """One PPO step on a scored rollout, phase by phase, with preemption
  checks between them."""
  config, rl = parts.config, parts.config.rl
  warming = index < config.critic.warmup_steps  # the critic trains alone
  arrays, extra, mismatch = trainer.training_inputs(parts, state, result,
                                                 preemption, stop, timer)
  with timer('values'):
    old_values = critic_values(parts, critic, values, state, arrays)
    # On the host only for the KL penalty in the token rewards.
    logps = fetch(extra) if rl.kl_in_reward and rl.kl_beta else {}
    rewards = critic_lib.token_rewards(result, arrays, logps, rl)
    advantages, returns = critic_lib.advantages(rewards, old_values, arrays,
                                                rl)
  preemption.check(stop)
  with timer('train'):
    policy, update_metrics = state.policy, dict(mismatch)
    if not warming:
      policy, policy_metrics = trainer.update_policy(
          parts, state.policy, dict(arrays, advantages=advantages), extra)
      update_metrics.update(policy_metrics)
    batch = {k: v for k, v in dict(arrays, returns=returns,
                                   old_values=old_values).items()
             if k in critic_lib.BATCH}
    critic_state, critic_metrics = phases.update(
        state.critic, critic.train_step,
        phases.on_mesh(batch, critic.mesh, config.sharding), rl,
        critic.mesh, config.sharding)
  with timer('weight_sync'):
    if not warming:
      parts.sampler.update_weights(policy.params, version=index + 1)
    else:  # the policy has not changed: the weights served are this step's
      parts.sampler.version = index + 1
  mask = arrays['loss_mask'][:, 1:] * (arrays['weights'][:, None] > 0)
  mean = lambda x: float((x * mask).sum() / max(mask.sum(), 1))
  update_metrics.update(
      {f'critic/{k}': v for k, v in critic_metrics.items()},
      return_mean=mean(returns),
      warmup=float(warming))
  if rl.kl_in_reward and 'ref_logps' in logps:  # the penalty's KL (k1)
    update_metrics['kl'] = mean(logps['old_logps'] - logps['ref_logps'])
  update_metrics.setdefault('loss', critic_metrics['loss'])
  return State(policy, critic_state), phases.step_metrics(
      result, update_metrics, timer, parts.sampler.last_sync,
      parts.reward_weights)


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  parts, heldout = trainer.build(config, runtime, meshes)
  critic = critic_lib.build(config, meshes, abstract=False)
  state = trainer.train(
      parts, heldout, workdir, preemption,
      State(parts.plan.policy.state, critic.state),
      functools.partial(step, critic=critic,
                        values=critic_lib.values_program(config, critic)),
      name='ppo')
  if config.export:
    setup.export(config, parts.plan.policy.model(state.params))


def compile_plan(config: Any, meshes: meshes_lib.RoleMeshes):
  """GRPO's programs (the policy's batch with per-token advantages) and the
  critic's train step and values pass, its state resident on its role."""
  plan = trainer.compile_plan(config, meshes)
  critic = critic_lib.build(config, meshes, abstract=True)
  rl = config.rl
  role = next(r for r, m in meshes.by_role.items() if m is critic.mesh)
  values = critic_lib.values_program(config, critic)
  params = nnx.state(critic.model())
  plan.phases += [
      program.train_phase(critic, plan_lib.batch_shapes(
          config, rl.mini_batch_size, critic.mesh,
          phases.SEQUENCES + ('loss_mask', 'weights'),
          token_names=('returns', 'old_values')), name='critic train step',
                          role=role),
      plans.Phase(
          'critic values', role, lambda: [values.lower(
              params, plan_lib.batch_shapes(config, rl.logps_micro_batch_size,
                                        critic.mesh, phases.SEQUENCES)
          ).compile()], resident_args=plans.per_device(params))]
  plan.resident.setdefault(role, {}).update(
      {f'critic {k}': v for k, v in program.resident(critic).items()})
  return plan
