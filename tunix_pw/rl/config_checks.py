"""The GRPO family's static config checks (no devices): the jobs that run
its loop (grpo, ppo, agentic) validate their configs with these first."""

from __future__ import annotations

from typing import Any

from tunix_pw import checks, registry
from tunix_pw.data import formats
from tunix_pw.errors import UsageError
from tunix_pw.models import checkpoints
from tunix_pw.rl import asynchronous, functions, plan as plan_lib
from tunix_pw.rl import prompts as prompts_lib, rewards
from tunix_pw.runtime import meshes as meshes_lib
from tunix_pw.sampling import tree as tree_lib
from tunix_pw.train import evaluate, optim, setup


def validate(config: Any) -> None:
  """A GRPO-family config, before any device work: sizes, the RL block's
  named losses and advantages, batch divisibility and the role meshes."""
  checks.at_least_one(config, '--config', 'steps', 'log_every',
                      'eval_batch_size', 'samples_per_log')
  checks.at_least_one(config.rl, '--config.rl', 'num_generations',
                      'prompts_per_step', 'mini_batch_size',
                      'micro_batch_size', 'logps_micro_batch_size',
                      'num_iterations', 'max_prompt_length', 'max_new_tokens')
  checks.not_negative(config.rl, '--config.rl', 'logits_chunk')
  checkpoints.check_model_block(config.model)
  prompts_lib.check(config)
  check_evaluation(config)
  optim.check(config.optimizer)
  setup.check_lora_block(config.lora)
  rl = config.rl
  check_importance(rl)
  asynchronous.check(config)
  for kind in ('advantage', 'policy_loss', 'aggregation', 'kl'):
    registry.check(kind, rl[kind], f'--config.rl.{kind}')
  source = functions.token_advantage(rl.advantage)
  if source and source.scorer not in config:
    raise UsageError(f'--config.rl.advantage={rl.advantage} needs a '
                     f'{source.scorer}: {source.setup}.')
  if plan_lib.from_teacher(rl):
    check_teacher(config)
  if rl.tree.chains:
    tree_lib.TreeShape.from_block(rl.tree).check(rl.num_generations)
    if source:
      raise UsageError(f'--config.rl.tree.chains={rl.tree.chains}: a tree '
                       "rollout's advantages are the tree's, not "
                       f'--config.rl.advantage={rl.advantage}; use a group '
                       'advantage (grpo) or tree.chains=0.')
    if rl.decode_chunk:
      raise UsageError(f'--config.rl.tree.chains={rl.tree.chains}: a tree '
                       'rollout decodes in its own segments; set '
                       '--config.rl.decode_chunk=0.')
    pictured = [block.name for block, _, _ in
                prompts_lib.datasets(config).values()
                if block.name in formats.PICTURED]
    if pictured:
      raise UsageError(f'--config.rl.tree.chains={rl.tree.chains}: a tree '
                       f'rollout grows no image prompts yet ({pictured[0]} '
                       'has images); set tree.chains=0.')
  samples = rl.prompts_per_step * rl.num_generations
  if rl.dynamic_sampling and rl.num_generations < 2:
    raise UsageError('--config.rl.dynamic_sampling drops groups of equal '
                     'rewards; it needs --config.rl.num_generations >= 2.')
  if rl.num_generations < (1 if source else 2):
    raise UsageError('--config.rl.num_generations must be at least 2 (a '
                     'group needs others to compare with).')
  if samples % rl.mini_batch_size or rl.mini_batch_size % rl.micro_batch_size:
    raise UsageError(
        f'--config.rl.mini_batch_size={rl.mini_batch_size} must divide the '
        f'{samples} samples of a step (prompts_per_step x num_generations) '
        f'and be divided by --config.rl.micro_batch_size='
        f'{rl.micro_batch_size}.')
  if samples % rl.logps_micro_batch_size:
    raise UsageError(f'--config.rl.logps_micro_batch_size='
                     f'{rl.logps_micro_batch_size} must divide the {samples} '
                     'samples of a step.')
  for role in ('actor', 'rollout'):
    if role not in config.meshes:
      raise UsageError(f'--config.meshes needs an {role} role.')
  meshes_lib.check_batch(rl.micro_batch_size, config.meshes, 'actor',
                         config.sharding.batch, '--config.rl.micro_batch_size')
  meshes_lib.check_batch(samples, config.meshes, 'rollout',
                         config.sharding.batch,
                         'prompts_per_step x num_generations')


def check_evaluation(config: Any) -> None:
  """pass@k's samples and the held-out verifier."""
  evaluate.check_sampled(config.eval_k, config.eval_n)
  rewards.verifier(config.eval_verifier, config.rl.rewards)


def check_importance(rl: Any) -> None:
  """TIS or MIS: one of them, its level and its thresholds."""
  if rl.tis_cap < 0 or rl.mis_threshold < 0:
    raise UsageError(f'--config.rl.tis_cap={rl.tis_cap} and mis_threshold='
                     f'{rl.mis_threshold} must be positive (or 0: off).')
  if rl.is_level not in ('',) + functions.IS_LEVELS:
    raise UsageError(f'--config.rl.is_level={rl.is_level!r} must be one of '
                     f'{", ".join(functions.IS_LEVELS)} (or empty).')
  if rl.is_low < 0 or rl.is_low > max(rl.tis_cap, rl.mis_threshold, 0.0):
    raise UsageError(f'--config.rl.is_low={rl.is_low} must be from 0 to the '
                     'upper threshold (tis_cap or mis_threshold).')
  if rl.tis_cap and rl.mis_threshold:
    raise UsageError('--config.rl.tis_cap and mis_threshold are two ways to '
                     'weight the same tokens: set one of them.')


def check_teacher(config: Any) -> None:
  """On-policy distillation's teacher and its `distill` settings."""
  checkpoints.check_model_block(config.teacher, '--config.teacher')
  setup.check_same_tokenizer(config.model, config.teacher)
  if 'distill' in config:
    d = config.distill
    setup.check_logit_distillation(d)
    if d.token_weight < 0 or d.weight + d.token_weight == 0:
      raise UsageError('--config.distill.weight and token_weight must be '
                       'at least 0, and not both 0.')
