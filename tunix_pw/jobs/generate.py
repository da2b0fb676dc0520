"""Generate: prompts through the rollout engine, completions printed (and
written as JSONL with tokens and log-probabilities). A JSONL prompt may
bring images (a vision-language model's): "images" beside "prompt" or
"messages", one '<start_of_image>' marker in the text per image."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

from etils import epath
import numpy as np

from tunix_pw import console
from tunix_pw.data import images as images_lib
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
  for field in ('max_per_record', 'max_pixels', 'max_bytes'):
    if config.images[field] < 1:
      raise UsageError(f'--config.images.{field}={config.images[field]} '
                       'must be at least 1.')


@dataclasses.dataclass(frozen=True)
class Prompt:
  """A prompt (text or messages), its images and where it was read."""

  prompt: Any
  images: tuple[Any, ...] = ()
  where: str = 'the prompt'


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


def read_prompts(path: str, limits: images_lib.Limits) -> list[Prompt]:
  """Text (a prompt per line) or JSONL ({"prompt": str} or {"messages":
  [{"role": str, "content": str}, ...]}, and optionally "images": [a path
  relative to this file, or a data: URI, ...]); a bad or empty line, or a
  bad image, is named with its line number."""
  prompts = []
  lines = epath.Path(path).read_text().splitlines()
  for number, line in enumerate(lines, 1):
    where = f'{path}:{number}'
    if not line.strip():
      raise UsageError(f'{where}: empty prompt.')
    if not path.endswith('.jsonl'):
      prompts.append(Prompt(line, where=where))
      continue
    try:
      record = json.loads(line)
    except ValueError as e:
      raise UsageError(f'{where}: not JSON ({e}).') from None
    prompt = _prompt_of(record)
    if prompt is None:
      raise UsageError(
          f'{where}: not a JSON object with a string "prompt" or a '
          'list of {"role": str, "content": str} "messages".')
    if not prompt:
      raise UsageError(f'{where}: empty prompt.')
    prompts.append(Prompt(prompt, _images(record, where, path, limits),
                          where))
  return prompts


def _images(record: dict[str, Any], where: str, path: str,
            limits: images_lib.Limits) -> tuple[Any, ...]:
  """A record's images, opened and checked."""
  entries = record.get('images', [])
  if not isinstance(entries, list):
    raise UsageError(f'{where}: "images" is not a list.')
  if len(entries) > limits.per_record:
    raise UsageError(f'{where}: {len(entries)} images, more than '
                     f'--config.images.max_per_record={limits.per_record}.')
  out = []
  for i, entry in enumerate(entries):
    try:
      out.append(images_lib.open_image(entry, os.path.dirname(path) or '.',
                                       limits))
    except ValueError as e:
      raise UsageError(f'{where}: image {i} {e}.') from None
  return tuple(out)


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

  raw = ([Prompt(config.prompt)] if config.prompt else
         read_prompts(config.prompts_file,
                      images_lib.Limits.from_block(config.images)))
  processing = _processing(config, cfg, raw)
  texts, ids, pixels = [], [], []
  for i, p in enumerate(raw):
    texts.append(tokenizers.render_prompt(tokenizer, p.prompt, config.chat))
    if not texts[-1].strip():
      raise UsageError(f'prompt {i} is empty.')
    own = [processing.pixels(image) for image in p.images]
    expand = (lambda text: text) if processing is None else functools.partial(
        processing.expand, crops=[len(x) - 1 for x in own])
    try:
      ids.append(tokenizers.encode_prompt(tokenizer, p.prompt, config.chat,
                                          expand))
    except UsageError as e:
      raise UsageError(f'{p.where}: {e}') from None
    pixels.append(np.concatenate(own) if own else None)

  records = []
  with console.Progress(len(texts), 'generate',
                        enabled=runtime.is_coordinator) as bar:
    for start in range(0, len(texts), config.batch_size):
      batch = texts[start:start + config.batch_size]
      out = sampler.generate(ids[start:start + config.batch_size], sampling,
                             _batch_images(pixels[start:start + len(batch)],
                                           cfg))
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


def _processing(config: Any, cfg: Any,
                prompts: list[Prompt]) -> images_lib.Processing | None:
  """The checkpoint's image preprocessing, when a prompt has images."""
  pictured = next((p for p in prompts if p.images), None)
  if pictured is None:
    return None
  if not cfg.vision:
    raise UsageError(f'{pictured.where}: the prompt has images, but the '
                     f'{cfg.family} model has no vision tower.')
  out = dataclasses.replace(
      images_lib.Processing.read(blocks.tokenizer_source(config.model)),
      pan_and_scan=config.images.pan_and_scan)
  v = cfg.vision
  if (out.image_seq_length, out.height, out.width) != (
      v.tokens_per_image, v.image_size, v.image_size):
    raise UsageError(
        f'the processor writes {out.image_seq_length} tokens for a '
        f'{out.height}x{out.width} image, but the model reads '
        f'{v.tokens_per_image} for a {v.image_size}x{v.image_size} one.')
  return out


def _batch_images(pixels: list[np.ndarray | None],
                  cfg: Any) -> list[np.ndarray] | None:
  """A batch's images for the sampler (None when no prompt has any)."""
  if all(p is None for p in pixels):
    return None
  v = cfg.vision
  none = np.zeros((0, v.channels, v.image_size, v.image_size), np.float32)
  return [none if p is None else p for p in pixels]
