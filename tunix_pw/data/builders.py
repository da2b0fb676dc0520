"""TFDS dataset builders writing array_record files (no TensorFlow).

- `arithmetic`: synthetic question/answer problems, deterministic for a
  config (digits, operations, split sizes, seed); train and test disjoint.
- `gsm8k`: GSM8K's published JSONL (`question`, `answer` ending in
  `#### <number>`), with the final number extracted for rewards.
- `preferences`: prompt / chosen / rejected, for DPO and ORPO.
- `unpaired`: prompt / completion / label (true: desirable), for KTO.
- `chat`: multi-turn `messages`, for SFT.
- `bars`: a synthetic visual task (which of two bars is taller), for
  vision-language models: each example an image and its one-word answer.

The JSONL builders read `<manual_dir>/{train,test}.jsonl`. A malformed line,
a missing field or an empty prompt stops the build with the file and line,
or, with `on_bad_line='skip'`, is skipped and counted in the dataset's
metadata (`skipped_lines` per split). The files' fingerprint is part of the
config name, so edited files are built afresh.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import io
import json
import os
import random
import re
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
import tensorflow_datasets as tfds

from tunix_pw.errors import UsageError

OPERATIONS = {'+': lambda a, b: a + b, '-': lambda a, b: a - b,
              '*': lambda a, b: a * b}
_OP_NAMES = {'+': 'add', '-': 'sub', '*': 'mul'}
SPLITS = ('train', 'test')


@dataclasses.dataclass
class ArithmeticConfig(tfds.core.BuilderConfig):
  digits: int = 2
  operations: str = '+'
  train_size: int = 5_000
  test_size: int = 1_000
  seed: int = 0


def arithmetic_config(digits: int = 2, operations: str = '+',
                      train_size: int = 5_000, test_size: int = 1_000,
                      seed: int = 0) -> ArithmeticConfig:
  bad = set(operations) - set(OPERATIONS)
  if bad or not operations:
    raise UsageError(f'arithmetic operations {operations!r} must be drawn '
                     f'from {"".join(OPERATIONS)}.')
  if digits < 1 or train_size < 1 or test_size < 1:
    raise UsageError(f'arithmetic digits={digits}, train_size={train_size} '
                     f'and test_size={test_size} must all be at least 1.')
  space = (9 * 10 ** (digits - 1)) ** 2 * len(operations)
  if train_size + test_size > space:
    raise UsageError(f'{train_size} + {test_size} problems do not fit '
                     f'disjointly in the {space} {digits}-digit problems.')
  name = (f'd{digits}_{"_".join(_OP_NAMES[o] for o in operations)}_'
          f'n{train_size}_{test_size}_s{seed}')
  return ArithmeticConfig(name=name, digits=digits, operations=operations,
                          train_size=train_size, test_size=test_size,
                          seed=seed)


class Arithmetic(tfds.core.GeneratorBasedBuilder):
  """'12+30=' -> '42'."""

  VERSION = tfds.core.Version('1.0.0')
  BUILDER_CONFIGS = [ArithmeticConfig(name='default')]

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(dict(
            question=tfds.features.Text(), answer=tfds.features.Text())))

  def _split_generators(self, dl_manager):
    del dl_manager
    c = self.builder_config
    rng = random.Random(c.seed)
    low, high = 10 ** (c.digits - 1), 10 ** c.digits
    wanted = c.train_size + c.test_size
    if (high - low) ** 2 * len(c.operations) <= 1_000_000:
      problems = [(a, op, b) for a in range(low, high) for op in c.operations
                  for b in range(low, high)]
      rng.shuffle(problems)  # distinct by construction
      problems = problems[:wanted]
    else:  # a space this large: draw, rejecting repeats
      seen, problems = set(), []
      while len(problems) < wanted:
        problem = (rng.randrange(low, high), rng.choice(c.operations),
                   rng.randrange(low, high))
        if problem not in seen:
          seen.add(problem)
          problems.append(problem)
    return {'train': self._generate_examples(problems[:c.train_size]),
            'test': self._generate_examples(problems[c.train_size:])}

  def _generate_examples(self, problems):
    for i, (a, op, b) in enumerate(problems):
      yield i, dict(question=f'{a}{op}{b}=', answer=str(OPERATIONS[op](a, b)))


def png_uri(image: Image.Image) -> str:
  """An image as a data: URI of its PNG bytes (how examples hold images)."""
  buffer = io.BytesIO()
  image.save(buffer, format='PNG')
  return 'data:image/png;base64,' + base64.b64encode(
      buffer.getvalue()).decode()


class Bars(tfds.core.GeneratorBasedBuilder):
  """'<start_of_image> Which bar is taller, left or right?' -> 'left' or
  'right', over a 64-pixel picture of two bars of random colours whose
  heights differ by at least 6 pixels: half the answers each, so chance is
  50%. Deterministic; train and test drawn apart (4,000 and 200)."""

  VERSION = tfds.core.Version('1.0.0')
  SIZES = dict(train=4_000, test=200)
  QUESTION = '<start_of_image> Which bar is taller, left or right?'

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(dict(
            question=tfds.features.Text(), answer=tfds.features.Text(),
            images=tfds.features.Sequence(tfds.features.Text()))))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(size, seed)
            for seed, (split, size) in enumerate(self.SIZES.items())}

  def _generate_examples(self, size: int, seed: int):
    rng = np.random.default_rng(seed)
    for i in range(size):
      heights = rng.choice(np.arange(8, 57), 2, replace=False)
      while abs(int(heights[0]) - int(heights[1])) < 6:
        heights = rng.choice(np.arange(8, 57), 2, replace=False)
      image = Image.new('RGB', (64, 64), (255, 255, 255))
      draw = ImageDraw.Draw(image)
      for left, height in zip((10, 38), heights):
        colour = tuple(int(c) for c in rng.integers(0, 200, 3))
        draw.rectangle((left, 60 - int(height), left + 15, 60), fill=colour)
      yield i, dict(question=self.QUESTION,
                    answer='left' if heights[0] > heights[1] else 'right',
                    images=[png_uri(image)])


# ------------------------------------------------------------- JSONL files


@dataclasses.dataclass
class JsonlConfig(tfds.core.BuilderConfig):
  on_bad_line: str = 'error'  # 'error' | 'skip'


def jsonl_config(manual_dir: str, on_bad_line: str = 'error') -> JsonlConfig:
  """A config named by the files' fingerprint: changed files rebuild."""
  if on_bad_line not in ('error', 'skip'):
    raise UsageError(f"on_bad_line={on_bad_line!r} must be 'error' or "
                     "'skip'.")
  files = []
  for split in SPLITS:
    path = os.path.join(manual_dir, f'{split}.jsonl')
    if not os.path.exists(path):
      raise UsageError(f'{path} is missing: the manual directory needs '
                       f'{" and ".join(s + ".jsonl" for s in SPLITS)}.')
    stat = os.stat(path)
    files.append((path, stat.st_size, stat.st_mtime_ns))
  return JsonlConfig(name=f'files_{_fingerprint(tuple(files), on_bad_line)}',
                     on_bad_line=on_bad_line)


@functools.lru_cache(maxsize=64)
def _fingerprint(files: tuple[tuple[str, int, int], ...],
                 on_bad_line: str) -> str:
  """The files' contents hashed, once per (path, size, mtime) in a process:
  a job asks for its builder when it validates and again when it builds."""
  digest = hashlib.sha256(on_bad_line.encode())
  for path, _, _ in files:
    with open(path, 'rb') as f:
      for block in iter(lambda: f.read(1 << 24), b''):
        digest.update(block)
  return digest.hexdigest()[:12]


class _JsonlBuilder(tfds.core.GeneratorBasedBuilder):
  """Reads `<manual_dir>/{train,test}.jsonl`: each subclass names its
  FIELDS (text features) and may check a record further in `_parse`."""

  FIELDS: tuple[str, ...] = ()

  VERSION = tfds.core.Version('1.0.0')
  MANUAL_DOWNLOAD_INSTRUCTIONS = ('Put train.jsonl and test.jsonl in the '
                                  'manual directory.')

  def _split_generators(self, dl_manager):
    self._skipped = {}
    return {split: self._generate_examples(split,
                                  os.path.join(dl_manager.manual_dir,
                                               f'{split}.jsonl'))
            for split in SPLITS}

  def _generate_examples(self, split: str, path: str):
    skipped, examples = 0, 0
    with open(path) as f:
      for number, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          record = json.loads(line)
          if not isinstance(record, dict):
            raise ValueError('not a JSON object')
          example = self._parse(record)
        except (ValueError, KeyError, TypeError) as e:
          if self.builder_config.on_bad_line == 'skip':
            skipped += 1
            continue
          message = str(e) if isinstance(e, ValueError) else (
              f'missing field {e}' if isinstance(e, KeyError) else str(e))
          raise UsageError(f'{path}:{number}: {message}.') from None
        examples += 1
        yield number, example
    if not examples:
      raise UsageError(f'{path} holds no examples' + (
          f' (bad lines skipped: {skipped})' if skipped else '') + '.')
    self._skipped[split] = skipped
    self.info.metadata['skipped_lines'] = dict(self._skipped)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=self._features(), metadata=tfds.core.MetadataDict())

  def _features(self):
    return tfds.features.FeaturesDict(
        {f: tfds.features.Text() for f in self.FIELDS})

  def _parse(self, record: dict[str, Any]) -> dict[str, Any]:
    return {f: _text(record, f) for f in self.FIELDS}


def _text(record: dict[str, Any], field: str) -> str:
  value = record[field]
  if not isinstance(value, str):
    raise ValueError(f'field {field!r} is not a string')
  if not value.strip():
    raise ValueError(f'field {field!r} is empty')
  return value


_FINAL = re.compile(r'####\s*(-?[\d,]*\.?\d+)\s*$')


def gsm8k_final_answer(answer: str) -> str:
  """The number after '####' (thousands separators removed)."""
  match = _FINAL.search(answer.strip())
  if not match:
    raise ValueError("the answer does not end in '#### <number>'")
  return match.group(1).replace(',', '')


class Gsm8k(_JsonlBuilder):
  """GSM8K from its published JSONL."""

  BUILDER_CONFIGS = [JsonlConfig(name='default')]
  FIELDS = ('question', 'answer', 'final_answer')

  def _parse(self, record):
    answer = _text(record, 'answer')
    return dict(question=_text(record, 'question'), answer=answer,
                final_answer=gsm8k_final_answer(answer))


class Preferences(_JsonlBuilder):
  """{"prompt", "chosen", "rejected"} per line."""

  BUILDER_CONFIGS = [JsonlConfig(name='default')]
  FIELDS = ('prompt', 'chosen', 'rejected')


class Unpaired(_JsonlBuilder):
  """{"prompt", "completion", "label": true | false} per line (the
  layout of TRL's unpaired preference sets): KTO's desirable and
  undesirable examples."""

  BUILDER_CONFIGS = [JsonlConfig(name='default')]

  def _features(self):
    return tfds.features.FeaturesDict(dict(
        prompt=tfds.features.Text(), completion=tfds.features.Text(),
        label=tfds.features.Scalar(np.bool_)))

  def _parse(self, record):
    if not isinstance(record['label'], bool):
      raise ValueError('field \'label\' is not true or false')
    return dict(prompt=_text(record, 'prompt'),
                completion=_text(record, 'completion'), label=record['label'])


class Chat(_JsonlBuilder):
  """{"messages": [{"role", "content"}, ...]} per line; the last message is
  the one SFT learns."""

  BUILDER_CONFIGS = [JsonlConfig(name='default')]

  def _features(self):
    return tfds.features.FeaturesDict(dict(messages=tfds.features.Sequence(
        dict(role=tfds.features.Text(), content=tfds.features.Text()))))

  def _parse(self, record):
    messages = record['messages']
    if not isinstance(messages, list) or len(messages) < 2:
      raise ValueError('"messages" needs at least two turns')
    return dict(messages=[dict(role=_text(m, 'role'),
                               content=_text(m, 'content'))
                          for m in messages])


class Code(_JsonlBuilder):
  """{"question", "answer" (a reference solution), "tests": [{"call":
  "f(2)", "expected": "7"}, ...]} per line: a test passes when the code,
  then `print(repr(<call>))`, prints `expected` (agents/envs.py's code
  task). The tests are kept as JSON text."""

  BUILDER_CONFIGS = [JsonlConfig(name='default')]
  FIELDS = ('question', 'answer', 'tests')

  def _parse(self, record):
    tests = record['tests']
    if not (isinstance(tests, list) and tests and all(
        isinstance(t, dict) and isinstance(t.get('call'), str) and
        isinstance(t.get('expected'), str) for t in tests)):
      raise ValueError('"tests" is not a list of {"call", "expected"} '
                       'strings')
    return dict(question=_text(record, 'question'),
                answer=_text(record, 'answer'), tests=json.dumps(tests))


SYNTHETIC = ('arithmetic', 'bars')  # built here, from no files
BUILDERS = {'arithmetic': Arithmetic, 'gsm8k': Gsm8k,
            'preferences': Preferences, 'unpaired': Unpaired, 'chat': Chat,
            'code': Code, 'bars': Bars}


def decode(example: dict[str, Any]) -> dict[str, Any]:
  """TFDS's bytes back to str (recursively), numbers untouched."""
  if isinstance(example, dict):
    return {k: decode(v) for k, v in example.items()}
  if isinstance(example, (bytes, np.bytes_)):
    return example.decode()
  if isinstance(example, list) or (isinstance(example, np.ndarray) and
                                   example.dtype.kind in 'SO'):
    return [decode(v) for v in example]
  return example
