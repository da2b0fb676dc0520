"""PPO with a critic (GAE) on the GRPO family's rollout and update phases.

  python -m tunix_pw.main --config=tunix_pw/configs/ppo.py:runlocal \
      --workdir=/tmp/ppo
  python -m tunix_pw.main --config=tunix_pw/configs/ppo.py:gemma2-2b \
      --config.model.checkpoint=/ckpt/gemma-2-2b-it \
      --config.data.manual_dir=/data/gsm8k --workdir=/gcs/bucket/ppo

arg: `<model preset or runlocal>`. Every field of GRPO's config applies
(`tunix_pw/configs/grpo.py`); PPO adds the critic block and GAE's fields.
"""

import ml_collections

from tunix_pw.configs import common, grpo


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  preset = arg or 'runlocal'
  local = preset == 'runlocal'
  c = grpo.get_config(preset)
  c.job = 'ppo'
  c.rl.update(dict(
      advantage='gae',  # per-token, from the critic
      num_generations=1,  # no groups: the critic is the baseline
      prompts_per_step=64 if local else 256,
      policy_loss='ppo_clip', eps_low=0.2, eps_high=0.2,
      aggregation='token-mean',
      gamma=1.0, lam=0.95,  # GAE
      whiten_advantages=True,
      entropy_coef=0.0,
      kl='k1', kl_beta=0.02,
      kl_in_reward=True))  # False: the KL (rl.kl estimator) is a loss term
  c.critic = ml_collections.ConfigDict(dict(
      init='policy',  # the policy's initial model; 'model': critic.model
      model=common.model('tiny-gemma' if local else preset),
      optimizer=common.optimizer(learning_rate=1e-3 if local else 1e-5,
                                 warmup_steps=0, schedule='constant'),
      value_clip=0.2,  # 0: unclipped
      warmup_steps=0))  # steps that train the critic alone
  # The critic on the actor's devices and axes (they follow the actor's
  # flags); its own mesh: --config.meshes.critic.{axes,devices}.
  c.meshes.critic = ml_collections.ConfigDict(dict(
      axes=c.meshes.actor.get_ref('axes'), devices='actor'))
  return c
