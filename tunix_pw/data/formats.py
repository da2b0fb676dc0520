"""From dataset examples to token sequences, per dataset and use.

`prompt_and_answer` says what each dataset asks and answers; the transforms
tokenize that (through the chat template when asked) into what the jobs
consume: SFT sequences with a loss mask on the completion, RL prompts with
their reference answers, preference pairs, KTO's labelled examples.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from tunix_pw.data import images as images_lib, pipeline
from tunix_pw.models import tokenizers
from tunix_pw.models.tokenizers import Tokenizer


PICTURED = ('bars',)  # datasets whose examples have images


def prompt_and_answer(name: str, example: dict[str, Any]) -> tuple[Any, str]:
  """(prompt text, or messages for the chat template; the target text)."""
  if name in ('arithmetic', 'bars'):
    return example['question'], example['answer']
  if name == 'gsm8k':
    return example['question'], example['answer']
  if name == 'chat':
    messages = [dict(role=r, content=c) for r, c in
                zip(example['messages']['role'],
                    example['messages']['content'])]
    return messages[:-1], messages[-1]['content']
  if name == 'preferences':
    return example['prompt'], example['chosen']
  raise ValueError(f'unknown dataset {name!r}')


def reference_answer(name: str, example: dict[str, Any]) -> str:
  """What a reward compares against: the final number for math sets."""
  if name == 'gsm8k':
    return example['final_answer']
  return prompt_and_answer(name, example)[1]


def prompt_ids(name: str, example: dict[str, Any], tokenizer: Tokenizer,
               chat: bool, processing: images_lib.Processing | None = None
               ) -> tuple[list[int], np.ndarray | None]:
  """An example's prompt as ids, and with `processing` (a vision-language
  model's) its images as pixels (None without): each image marker written
  out as the image's tokens."""
  prompt, _ = prompt_and_answer(name, example)
  if processing is None:
    return tokenizers.encode_prompt(tokenizer, prompt, chat), None
  pixels, crops = processing.prompt_images(example.get('images', []))
  return tokenizers.encode_prompt(
      tokenizer, prompt, chat,
      functools.partial(processing.expand, crops=crops)), pixels


def sft_transform(name: str, tokenizer: Tokenizer, max_length: int,
                  overlong: str, chat: bool,
                  processing: images_lib.Processing | None = None
                  ) -> Callable:
  """Example -> tokens with a loss mask on the completion (and its eos),
  and with `processing` its images."""

  def transform(example, counters):
    ids, pixels = prompt_ids(name, example, tokenizer, chat, processing)
    answer = prompt_and_answer(name, example)[1]
    answer_ids = tokenizer.encode(answer) + [tokenizer.eos_id]
    row = pipeline.fit(ids + answer_ids,
                       [0] * len(ids) + [1] * len(answer_ids),
                       max_length, overlong, counters)
    if row is not None and pixels is not None:
      row['images'] = pixels
    return row

  return transform


def prompt_transform(name: str, tokenizer: Tokenizer, max_prompt_length: int,
                     chat: bool,
                     processing: images_lib.Processing | None = None
                     ) -> Callable:
  """Example -> a prompt for generation and the answer a reward checks
  (and with `processing`, its images); prompts over `max_prompt_length`
  tokens are dropped (counted)."""

  def transform(example, counters):
    counters.examples += 1
    ids, pixels = prompt_ids(name, example, tokenizer, chat, processing)
    if len(ids) > max_prompt_length:
      counters.dropped += 1
      return None
    return dict(prompt=ids, answer=reference_answer(name, example),
                index=example['index'],
                **({} if pixels is None else {'images': pixels}))

  return transform


def preference_pair(name: str, example: dict[str, Any]) -> tuple[Any, str,
                                                                  str]:
  """(prompt, chosen, rejected). Arithmetic gives a built-in preference set:
  the right answer over a near miss (for :runlocal configs and tests)."""
  if name == 'preferences':
    return example['prompt'], example['chosen'], example['rejected']
  if name == 'arithmetic':
    answer = int(example['answer'])
    miss = answer + (1 + example['index'] % 9) * (-1 if example['index'] % 2
                                                   else 1)
    return example['question'], str(answer), str(miss)
  raise ValueError(f'{name!r} has no preference pairs; use preferences or '
                   'arithmetic')


def preference_transform(name: str, tokenizer: Tokenizer, max_length: int,
                         overlong: str, chat: bool) -> Callable:
  """Example -> chosen and rejected sequences sharing the prompt, each with
  a loss mask on its completion; a pair is dropped (or both truncated) when
  either exceeds `max_length`."""

  def transform(example, counters):
    prompt, chosen, rejected = preference_pair(name, example)
    prompt_ids = tokenizers.encode_prompt(tokenizer, prompt, chat)
    sides = {}
    for side, text in (('chosen', chosen), ('rejected', rejected)):
      completion = tokenizer.encode(text) + [tokenizer.eos_id]
      sides[side] = (prompt_ids + completion,
                     [0] * len(prompt_ids) + [1] * len(completion))
    counters.examples += 1
    if max(len(tokens) for tokens, _ in sides.values()) > max_length:
      if overlong == 'drop':
        counters.dropped += 1
        return None
      counters.truncated += 1
    out = {}
    for side, (tokens, mask) in sides.items():
      out[f'{side}_tokens'] = np.asarray(tokens[:max_length], np.int32)
      out[f'{side}_loss_mask'] = np.asarray(mask[:max_length], np.int32)
    return out

  return transform


def pad_pairs(rows: list[dict[str, Any]], length: int,
              pad_id: int) -> dict[str, Any]:
  """Both sides of each pair padded to one length: chosen_* and rejected_*
  arrays [B, length]."""
  out = {}
  for side in ('chosen', 'rejected'):
    padded = pipeline.pad_batch(
        [dict(tokens=r[f'{side}_tokens'], loss_mask=r[f'{side}_loss_mask'])
         for r in rows], length, pad_id)
    out.update({f'{side}_{k}': v for k, v in padded.items()})
  return out


def unpaired_transform(name: str, tokenizer: Tokenizer, max_length: int,
                       overlong: str, chat: bool) -> Callable:
  """Example -> KTO's labelled sequence (`unpaired` data), or, for a set of
  pairs, the pair (split by `kto_batch` into a desirable and an undesirable
  example)."""
  if name != 'unpaired':
    return preference_transform(name, tokenizer, max_length, overlong, chat)

  def transform(example, counters):
    prompt_ids = tokenizers.encode_prompt(tokenizer, example['prompt'], chat)
    completion = tokenizer.encode(example['completion']) + [tokenizer.eos_id]
    row = pipeline.fit(prompt_ids + completion,
                       [0] * len(prompt_ids) + [1] * len(completion),
                       max_length, overlong, counters)
    return row and dict(completion_tokens=row['tokens'],
                        completion_loss_mask=row['loss_mask'],
                        desirable=np.float32(example['label']))

  return transform


def kto_batch(rows: list[dict[str, Any]], length: int,
              pad_id: int) -> dict[str, Any]:
  """KTO's batch: each example (a pair's chosen side is desirable, its
  rejected side undesirable; all chosen sides first) and its mismatched
  sequence, its prompt with the next example's completion (the batch's
  KL estimate, Ethayarajh et al. 2024)."""
  if 'chosen_tokens' in rows[0]:
    rows = [dict(completion_tokens=r[f'{side}_tokens'],
                 completion_loss_mask=r[f'{side}_loss_mask'],
                 desirable=np.float32(side == 'chosen'))
            for side in ('chosen', 'rejected') for r in rows]
  parts = [(r['completion_tokens'], r['completion_loss_mask'].astype(bool))
           for r in rows]
  mismatched = []
  for (tokens, mask), (other, other_mask) in zip(parts,
                                                 parts[1:] + parts[:1]):
    prompt, completion = tokens[~mask], other[other_mask]
    mismatched.append(dict(
        tokens=np.concatenate([prompt, completion])[:length],
        loss_mask=np.concatenate([np.zeros_like(prompt),
                                  np.ones_like(completion)])[:length]))
  out = {'desirable': np.asarray([r['desirable'] for r in rows], np.float32)}
  for side, examples in (('completion', [dict(tokens=t, loss_mask=m)
                                         for t, m in parts]),
                         ('mismatched', mismatched)):
    padded = pipeline.pad_batch(examples, length, pad_id)
    out.update({f'{side}_{k}': v for k, v in padded.items()})
  return out
