"""Pairs: preference data from a checkpoint's own samples on a task with
a checker (the exact-answer reward).

For each prompt of a split, `samples` completions at the sampling block's
temperature. `format='pairs'`: when some are right and some wrong, one
pair, chosen = a right completion, rejected = a wrong one for the same
prompt (the `preferences` dataset, for the reward model and DPO).
`format='unpaired'`: each distinct completion with its label, right or
wrong, whatever the others are (the `unpaired` dataset, for KTO). Writes
`<output_dir>/{train,test}.jsonl`, each file whole or not at all.
"""

from __future__ import annotations

import json
import os
from typing import Any

from tunix_pw import console
from tunix_pw.data import builders, formats, pipeline
from tunix_pw.errors import UsageError
from tunix_pw.models import blocks, checkpoints, tokenizers
from tunix_pw.rl import rewards
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.fetch import fetch
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.sampling.sampler import make_sampler
from tunix_pw.train import setup

SPLITS = ('train', 'test')
FORMATS = ('pairs', 'unpaired')


def validate(config: Any) -> None:
  checkpoints.check_model_block(config.model)
  pipeline.check_data_block(config.data)
  SamplingConfig.from_block(config.sampling)
  if not config.output_dir:
    raise UsageError('--config.output_dir is required: the directory that '
                     'receives train.jsonl and test.jsonl.')
  if config.format not in FORMATS:
    raise UsageError(f'--config.format={config.format!r} must be one of '
                     f'{", ".join(FORMATS)}.')
  if config.samples < 2 or config.batch_size < 1:
    raise UsageError(f'--config.samples={config.samples} must be at least 2 '
                     f'(a right and a wrong one) and --config.batch_size='
                     f'{config.batch_size} at least 1.')


def records(prompt: str, answer: str, completions: list[str], budget: int,
            form: str) -> list[dict[str, Any]]:
  """A prompt's records: one pair (none when its completions are all right
  or all wrong), or each distinct completion with its label."""
  right = [c for c in completions if rewards.exact_answer(rewards.Sample(
      prompt, c, answer, 0, budget, False))]
  wrong = [c for c in completions if c not in right]
  if form == 'unpaired':
    return [dict(prompt=prompt, completion=c, label=c in right)
            for c in dict.fromkeys(completions)]
  if not right or not wrong:
    return []
  return [dict(prompt=prompt, chosen=right[0], rejected=wrong[0])]


def split_records(config: Any, source: Any, count: int, sampler: Any,
                  tokenizer: Any, runtime: Any,
                  preemption: Preemption) -> list[dict[str, Any]]:
  """Records from the first `count` prompts of a split."""
  sampling = SamplingConfig.from_block(config.sampling)
  name, out = config.data.name, []
  count = min(count, len(source))
  with console.Progress(count, 'pairs',
                        enabled=runtime.is_coordinator) as bar:
    for start in range(0, count, config.batch_size):
      examples = [dict(builders.decode(source[i]), index=i)
                  for i in range(start, min(start + config.batch_size, count))]
      texts = [formats.prompt_and_answer(name, e)[0] for e in examples]
      ids = [tokenizers.encode_prompt(tokenizer, t, config.data.chat)
             for t in texts for _ in range(config.samples)]
      generated = sampler.generate(ids, sampling)
      tokens, lengths = fetch((generated.tokens, generated.lengths))
      for k, (text, example) in enumerate(zip(texts, examples)):
        rows = range(k * config.samples, (k + 1) * config.samples)
        out += records(text, formats.reference_answer(name, example),
                       [tokenizer.decode([t for t in tokens[r, :lengths[r]]
                                          if t not in tokenizer.stop_ids])
                        for r in rows], sampling.max_new_tokens,
                       config.format)
      bar.update(len(examples))
      preemption.check()
  return out


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  del workdir
  mesh = meshes['rollout']
  model, _ = setup.model_from_block(config.model, seed=config.seed, mesh=mesh,
                                    rules=config.sharding)
  tokenizer = blocks.tokenizer(config.model)
  sampler = make_sampler(model, tokenizer, mesh=mesh, rules=config.sharding,
                         runtime=runtime)
  sources, _ = pipeline.prepare(pipeline.DataSpec.from_block(config.data),
                                runtime)
  counts = dict(train=config.train_prompts, test=config.test_prompts)
  found = {split: split_records(config, sources[split], counts[split],
                                sampler, tokenizer, runtime, preemption)
           for split in SPLITS}
  for split, rows in found.items():
    if not rows:
      raise UsageError(
          f'no prompt of the {split} split had both a right and a wrong '
          f'completion among {config.samples}; raise --config.samples or '
          '--config.sampling.temperature (nothing was written).')
  if not runtime.is_coordinator:
    return
  os.makedirs(config.output_dir, exist_ok=True)
  for split, rows in found.items():
    path = os.path.join(config.output_dir, f'{split}.jsonl')
    with open(path + '.tmp', 'w') as f:
      f.writelines(json.dumps(r) + '\n' for r in rows)
    os.replace(path + '.tmp', path)
    print(f'pairs: {split}: {len(rows)} {config.format} records from '
          f'{min(counts[split], len(sources[split]))} prompts -> {path}')
