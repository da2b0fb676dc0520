"""Generate: prompts through the rollout engine, completions printed (and
written as JSONL with tokens and log-probabilities)."""

from __future__ import annotations

import json
from typing import Any

from etils import epath

from tunix_pw import console
from tunix_pw.errors import UsageError
from tunix_pw.models import blocks, checkpoints, tokenizers
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.fetch import fetch
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.sampling.sampler import make_sampler
from tunix_pw.train import setup


def validate(config: Any) -> None:
  checkpoints.check_model_block(config.model)
  SamplingConfig.from_block(config.sampling)
  if bool(config.prompt) == bool(config.prompts_file):
    raise UsageError('give exactly one of --config.prompt and '
                     '--config.prompts_file.')
  if config.prompts_file and not epath.Path(config.prompts_file).exists():
    raise UsageError(f'--config.prompts_file={config.prompts_file!r} does not '
                     'exist.')
  if config.batch_size < 1:
    raise UsageError(f'--config.batch_size={config.batch_size} must be at '
                     'least 1.')


def _is_message(m: Any) -> bool:
  return (isinstance(m, dict) and isinstance(m.get('role'), str) and
          isinstance(m.get('content'), str))


def _prompt_of(record: Any) -> Any:
  """The prompt of a JSONL record, or None when it holds neither a string
  "prompt" nor a non-empty list of {role, content} "messages"."""
  if not isinstance(record, dict):
    return None
  if 'messages' in record:
    messages = record['messages']
    ok = (isinstance(messages, list) and messages and
          all(_is_message(m) for m in messages))
    return messages if ok else None
  prompt = record.get('prompt')
  return prompt if isinstance(prompt, str) else None


def read_prompts(path: str) -> list[Any]:
  """Text (a prompt per line) or JSONL ({"prompt": str} or {"messages":
  [{"role": str, "content": str}, ...]}); a bad or empty line is named
  with its number."""
  prompts = []
  lines = epath.Path(path).read_text().splitlines()
  for number, line in enumerate(lines, 1):
    if not line.strip():
      raise UsageError(f'{path}:{number}: empty prompt.')
    if not path.endswith('.jsonl'):
      prompts.append(line)
      continue
    try:
      prompt = _prompt_of(json.loads(line))
    except ValueError as e:
      raise UsageError(f'{path}:{number}: not JSON ({e}).') from None
    if prompt is None:
      raise UsageError(
          f'{path}:{number}: not a JSON object with a string "prompt" or a '
          'list of {"role": str, "content": str} "messages".')
    if not prompt:
      raise UsageError(f'{path}:{number}: empty prompt.')
    prompts.append(prompt)
  return prompts


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  mesh = meshes['rollout']
  model, cfg = setup.model_from_block(config.model, seed=config.seed,
                                     mesh=mesh, rules=config.sharding)
  tokenizer = blocks.tokenizer(config.model)
  if tokenizer.vocab_size > cfg.vocab_size:
    raise UsageError(f'the tokenizer has {tokenizer.vocab_size} tokens but '
                     f'the model only {cfg.vocab_size}.')
  sampler = make_sampler(model, tokenizer, mesh=mesh, rules=config.sharding,
                         runtime=runtime,
                         max_cache=config.sampling.max_cache or None)
  sampling = SamplingConfig.from_block(config.sampling)

  raw = ([config.prompt] if config.prompt else
         read_prompts(config.prompts_file))
  texts, ids = [], []
  for i, prompt in enumerate(raw):
    texts.append(tokenizers.render_prompt(tokenizer, prompt, config.chat))
    if not texts[-1].strip():
      raise UsageError(f'prompt {i} is empty.')
    ids.append(tokenizers.encode_prompt(tokenizer, prompt, config.chat))

  records = []
  with console.Progress(len(texts), 'generate',
                        enabled=runtime.is_coordinator) as bar:
    for start in range(0, len(texts), config.batch_size):
      batch = texts[start:start + config.batch_size]
      out = sampler.generate(ids[start:start + config.batch_size], sampling)
      tokens, logprobs, lengths = fetch((out.tokens, out.logprobs,
                                         out.lengths))
      for row, text in enumerate(batch):
        n = int(lengths[row])
        records.append(dict(prompt=text,
                            completion=tokenizer.decode(tokens[row, :n]),
                            tokens=tokens[row, :n].tolist(),
                            logprobs=logprobs[row, :n].tolist()))
      bar.update(len(batch))
      preemption.check()

  if runtime.is_coordinator:
    for i, r in enumerate(records):
      print(f'=== {i}: {r["prompt"]!r}\n{r["completion"]}')
    if config.output_jsonl:
      epath.Path(config.output_jsonl).write_text(
          ''.join(json.dumps(r) + '\n' for r in records))
