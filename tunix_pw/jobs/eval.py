"""Eval: a model (trained workdir, Hugging Face or Kaggle checkpoint) on a
held-out split: greedy exact match against the reference answers (with
pass@k and maj@k of sampled answers when --config.k), or the token loss of
the reference completions."""

from __future__ import annotations

import json
from typing import Any

from etils import epath
import jax

from tunix_pw import workdir as workdir_lib
from tunix_pw.data import formats, pipeline
from tunix_pw.errors import UsageError
from tunix_pw.models import blocks, checkpoints
from tunix_pw.rl import rewards
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.fetch import fetch
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.sampling.sampler import make_sampler
from tunix_pw.train import evaluate, setup
from tunix_pw.train.step import model_token_nll

MODES = ('exact_match', 'loss')


def validate(config: Any) -> None:
  checkpoints.check_model_block(config.model)
  pipeline.check_data_block(config.data)
  if config.mode not in MODES:
    raise UsageError(f'--config.mode={config.mode!r} is unknown; use one of '
                     f'{", ".join(MODES)}.')
  rewards.verifier(config.verifier, field='--config.verifier')
  evaluate.check_sampled(config.k, config.n, '--config.')
  if config.examples < 1 or config.batch_size < 1:
    raise UsageError('--config.examples and --config.batch_size must be at '
                     'least 1.')


def heldout_loss(model, tokenizer, config, source) -> dict[str, float]:
  transform = formats.sft_transform(config.data.name, tokenizer,
                                    config.data.max_length,
                                    config.data.overlong, config.data.chat)
  rows = [r for r in (transform(dict(pipeline.builders.decode(source[i]),
                                     index=i), pipeline.Counters())
                      for i in range(min(config.examples, len(source))))
          if r is not None]

  @jax.jit
  def sums(model, batch):  # the logits a chunk of positions at a time
    nll, weight, _ = model_token_nll(model, batch['tokens'],
                                     batch['positions'], batch['segment_ids'],
                                     batch['loss_mask'])
    return (nll * weight).sum(), weight.sum()

  total, count = 0.0, 0.0
  for start in range(0, len(rows), config.batch_size):
    batch = pipeline.pad_batch(rows[start:start + config.batch_size],
                               config.data.max_length, tokenizer.pad_id)
    loss, weight = fetch(sums(model, batch))
    total, count = total + float(loss), count + float(weight)
  return dict(loss=total / max(count, 1), tokens=count, total=len(rows))


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  del preemption  # one pass, nothing worth a checkpoint
  mesh = meshes['rollout']
  model, _ = setup.model_from_block(config.model, seed=config.seed, mesh=mesh,
                                    rules=config.sharding)
  tokenizer = blocks.tokenizer(config.model)
  spec = pipeline.DataSpec.from_block(config.data)
  source = pipeline.prepare(spec, runtime)[0][config.split]
  if config.mode == 'loss':
    result = heldout_loss(model, tokenizer, config, source)
  else:
    prompts, answers, _ = setup.heldout(spec.name, source, tokenizer,
                                        config.examples, config.data.chat)
    sampler = make_sampler(model, tokenizer, mesh=mesh, rules=config.sharding,
                           runtime=runtime)
    verifier = rewards.verifier(config.verifier, field='--config.verifier')
    result = evaluate.exact_match(sampler, tokenizer, prompts, answers,
                                  config.max_new_tokens, config.batch_size,
                                  verifier)
    if config.k:
      result.update(evaluate.sampled(
          sampler, tokenizer, prompts, answers, config.k, config.n or config.k,
          SamplingConfig(config.max_new_tokens, config.temperature,
                         seed=config.seed), config.batch_size, verifier))
  if runtime.is_coordinator:
    (epath.Path(workdir) / workdir_lib.EVAL).write_text(json.dumps(result))
    print(f'eval: {spec.name}/{config.split} {config.mode}: ' + ', '.join(
        f'{k} {v:.4g}' for k, v in result.items()))

