"""The RL jobs' prompts: one dataset, or a mixture of several, each scored
by its own rewards; their checks, and the prompt streams with their
held-out sets."""

from __future__ import annotations

from typing import Any

from tunix_pw import checks
from tunix_pw.data import formats, mixture, pipeline
from tunix_pw.errors import UsageError
from tunix_pw.models import checkpoints
from tunix_pw.rl import judge as judge_lib, rewards as rewards_lib
from tunix_pw.runtime import backend
from tunix_pw.train import setup


def datasets(config: Any) -> dict[str, tuple[Any, float, str]]:
  """name -> (data block, weight, rewards): the mixture's datasets, or the
  data block alone (named '') scored by --config.rl.rewards."""
  if not config.mixture:
    return {'': (config.data, 1.0, config.rl.rewards)}
  return {name: (entry.data, entry.weight, entry.rewards)
          for name, entry in config.mixture.items()}


def check(config: Any) -> None:
  """The datasets' blocks and rewards, and the models the rewards name."""
  for name, (block, weight, rewards) in datasets(config).items():
    prefix = f'--config.mixture.{name}' if name else '--config'
    pipeline.check_data_block(block, f'{prefix}.data')
    rewards_lib.parse_weights(rewards, f'{prefix}.rewards' if name
                              else '--config.rl.rewards')
    if weight <= 0:
      raise UsageError(f'{prefix}.weight={weight} must be positive.')
  named = {name for _, _, rewards in datasets(config).values()
           for name, _ in rewards_lib.parse_weights(rewards)}
  for reward, what in (('reward_model', 'a reward model exported by the '
                        'reward_model job'),
                       ('judge', 'a model to grade the samples')):
    if (reward in named) != bool(config.rl[reward]):
      raise UsageError(
          f'the {reward} reward needs --config.rl.{reward} ({what}), and '
          f'that model a reward naming it (e.g. --config.rl.rewards='
          f'{reward}:1).')
  if config.rl.reward_model and checks.scope().files:
    checkpoints.detect(config.rl.reward_model)  # exists, Hugging Face
  if config.rl.judge:
    judge_lib.check(config.rl)


def prompts(config: Any, runtime: backend.Runtime, tokenizer: Any):
  """(the prompt stream, the held-out sets by name, the reward weights by
  dataset): one dataset's pipeline, or a mixture's."""
  rl, entries = config.rl, datasets(config)
  streams, heldout, reward_weights = {}, {}, {}
  for name, (block, _, rewards) in entries.items():
    spec = pipeline.DataSpec.from_block(block)
    sources, _ = pipeline.prepare(spec, runtime)
    processing = setup.image_processing(block, config.model)
    streams[name] = pipeline.Pipeline(
        sources['train'], formats.prompt_transform(
            spec.name, tokenizer, rl.max_prompt_length, block.chat,
            processing),
        batch_size=rl.prompts_per_step if len(entries) == 1 else 1,
        seed=config.seed, num_epochs=None,
        what=f'the train split of {spec.name}',
        dropping=f'prompts longer than --config.rl.max_prompt_length='
        f'{rl.max_prompt_length} tokens are dropped')
    heldout[name] = setup.heldout(spec.name, sources['test'], tokenizer,
                                  config.eval_examples, block.chat,
                                  processing)
    reward_weights[name] = rewards_lib.parse_weights(rewards)
  data = streams[''] if '' in streams else mixture.Mixture(
      streams, {n: w for n, (_, w, _) in entries.items()},
      rl.prompts_per_step, config.seed)
  return data, heldout, reward_weights
