"""Images for vision-language models: a data record's images opened
safely, and Gemma 3's image preprocessing done as its Hugging Face
processor does it, from the checkpoint's own preprocessor_config.json.

A record names an image by a path relative to its data file (never
outside that file's directory) or by a `data:image/...;base64,` URI; its
bytes and its pixel count (read from the header, before anything is
decoded: no decompression bombs) are capped by `Limits`.

An image becomes the processor's pixels: RGB, optionally cut into
pan-and-scan crops along its long side, each (the whole image first)
resized with PIL to the model's square, rescaled to [0, 1] and normalised
per channel. A prompt's image markers ('<start_of_image>' where an image
goes) become the token layout the model was trained on: each image's
`image_seq_length` soft tokens between begin and end tokens, and with
crops a sentence that introduces them.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import json
import math
import os
import posixpath
from typing import Any

from etils import epath

import numpy as np
from PIL import Image

from tunix_pw.errors import UsageError

PREPROCESSOR, PROCESSOR = 'preprocessor_config.json', 'processor_config.json'


@dataclasses.dataclass(frozen=True)
class Limits:
  """What a record's images may be (`--config.images.*`)."""

  per_record: int = 8
  pixels: int = 4096 * 4096
  bytes: int = 32 << 20

  @classmethod
  def from_block(cls, block: Any) -> 'Limits':
    return cls(block.max_per_record, block.max_pixels, block.max_bytes)


def open_image(entry: Any, directory: str, limits: Limits) -> Image.Image:
  """The decoded image a data record names (`entry`: a path relative to
  `directory`, the data file's, or a base64 data URI). A bad one raises
  ValueError saying what is wrong with it."""
  if not isinstance(entry, str) or not entry:
    raise ValueError('is not a path or a data: URI')
  if entry.startswith('data:'):
    head, _, payload = entry.partition(',')
    if not head.endswith(';base64'):
      raise ValueError('is a data: URI without base64 bytes')
    if len(payload) * 3 // 4 > limits.bytes:
      raise ValueError(f'holds more than {limits.bytes} bytes '
                       '(--config.images.max_bytes)')
    try:
      data = base64.b64decode(payload, validate=True)
    except binascii.Error:
      raise ValueError('is a data: URI whose base64 does not decode') from None
  else:
    data = _read_inside(entry, directory, limits)
  try:
    image = Image.open(io.BytesIO(data))
  except (OSError, Image.DecompressionBombError) as e:
    raise ValueError(f'is not a readable image ({e})') from None
  width, height = image.size
  if width * height > limits.pixels:
    raise ValueError(f'is {width}x{height} pixels, more than '
                     f'{limits.pixels} (--config.images.max_pixels)')
  try:
    image.load()
  except (OSError, ValueError) as e:
    raise ValueError(f'is not a readable image ({e})') from None
  return image


def _read_inside(entry: str, directory: str, limits: Limits) -> bytes:
  """The bytes of the file `entry` names below `directory`."""
  name = f'({entry!r})'
  local = '://' not in directory
  resolve = os.path.realpath if local else posixpath.normpath
  root = resolve(directory)
  path = resolve(posixpath.join(directory, entry))
  if posixpath.isabs(entry) or not path.startswith(root.rstrip('/') + '/'):
    raise ValueError(f'{name} is outside the data file\'s directory')
  file = epath.Path(path)
  if not file.is_file():
    raise ValueError(f'{name} does not exist')
  if file.stat().length > limits.bytes:
    raise ValueError(f'{name} has more than {limits.bytes} bytes '
                     '(--config.images.max_bytes)')
  return file.read_bytes()


@dataclasses.dataclass(frozen=True)
class Processing:
  """What preprocessor_config.json says (nulls: the processor's
  defaults), and the tokens an image's place is written with."""

  height: int = 224
  width: int = 224
  resample: int = Image.Resampling.BILINEAR
  rescale: float = 1 / 255
  mean: tuple[float, ...] = (0.5, 0.5, 0.5)
  std: tuple[float, ...] = (0.5, 0.5, 0.5)
  pan_and_scan: bool = False
  min_crop: int = 256
  max_crops: int = 4
  min_ratio: float = 1.2
  image_seq_length: int = 256
  begin: str = '<start_of_image>'
  soft: str = '<image_soft_token>'
  end: str = '<end_of_image>'

  @classmethod
  def read(cls, directory: str) -> 'Processing':
    """The processing of the checkpoint in `directory`: its
    preprocessor_config.json, or as transformers 5 writes it, the
    image_processor of its processor_config.json; and its
    tokenizer_config.json's image tokens."""
    processor = _json(os.path.join(directory, PROCESSOR))
    config = {**_json(os.path.join(directory, PREPROCESSOR)),
              **processor.get('image_processor', {})}
    if not config:
      raise UsageError(f'{directory} has no {PREPROCESSOR} or '
                       f'{PROCESSOR} with an image_processor: a '
                       'vision-language checkpoint ships its image '
                       'preprocessing.')
    config.setdefault('image_seq_length', processor.get('image_seq_length'))
    tokens = _json(os.path.join(directory, 'tokenizer_config.json')).get(
        'extra_special_tokens') or {}
    fields = dict(
        resample=config.get('resample'),
        rescale=config.get('rescale_factor'),
        mean=config.get('image_mean'), std=config.get('image_std'),
        pan_and_scan=config.get('do_pan_and_scan'),
        min_crop=config.get('pan_and_scan_min_crop_size'),
        max_crops=config.get('pan_and_scan_max_num_crops'),
        min_ratio=config.get('pan_and_scan_min_ratio_to_activate'),
        image_seq_length=config.get('image_seq_length'),
        begin=tokens.get('boi_token'), soft=tokens.get('image_token'),
        end=tokens.get('eoi_token'),
        **{k: (config.get('size') or {}).get(k) for k in ('height', 'width')})
    given = {k: tuple(v) if isinstance(v, list) else v
             for k, v in fields.items() if v is not None}
    return cls(**given)

  @classmethod
  def for_model(cls, directory: str, vision: Any) -> 'Processing':
    """The processing of the checkpoint in `directory` when it ships one,
    else Gemma 3's defaults at the model's image size and token count (a
    model initialised from a preset)."""
    if directory and any(os.path.exists(os.path.join(directory, name))
                         for name in (PREPROCESSOR, PROCESSOR)):
      return cls.read(directory)
    return cls(height=vision.image_size, width=vision.image_size,
               image_seq_length=vision.tokens_per_image)

  def prompt_images(self, entries: list[str]) -> tuple[np.ndarray, list[int]]:
    """A data example's images (data: URIs, as the builders store them)
    as pixels [images and crops, C, H, W] and each image's crop count."""
    pixels = [self.pixels(open_image(e, '', Limits())) for e in entries]
    empty = np.zeros((0, 3, self.height, self.width), np.float32)
    return np.concatenate([empty] + pixels), [len(p) - 1 for p in pixels]

  def crops(self, width: int, height: int) -> list[tuple[int, int, int, int]]:
    """Pan and scan: the (left, top, right, bottom) boxes an image of this
    size is cut into along its long side (none when it is near square,
    the crops would be under `min_crop`, or pan and scan is off)."""
    if not self.pan_and_scan:
      return []
    long, short = max(width, height), min(width, height)
    if long / short < self.min_ratio:
      return []
    count = min(int(math.floor(long / short + 0.5)),
                int(math.floor(long / self.min_crop)))
    count = min(self.max_crops, max(2, count))
    across = width >= height
    size_w = math.ceil(width / count) if across else width
    size_h = height if across else math.ceil(height / count)
    if min(size_w, size_h) < self.min_crop:
      return []
    return [(i * size_w, 0, min((i + 1) * size_w, width), height) if across
            else (0, i * size_h, width, min((i + 1) * size_h, height))
            for i in range(count)]

  def pixels(self, image: Image.Image) -> np.ndarray:
    """[1 + crops, C, height, width] float32: the whole image, then its
    pan-and-scan crops."""
    rgb = image if image.mode == 'RGB' else image.convert('RGB')
    whole = np.asarray(rgb)
    parts = [whole] + [whole[top:bottom, left:right] for left, top, right,
                       bottom in self.crops(rgb.width, rgb.height)]
    mean = np.asarray(self.mean, np.float32)
    std = np.asarray(self.std, np.float32)

    def one(part: np.ndarray) -> np.ndarray:
      resized = np.asarray(Image.fromarray(part).resize(
          (self.width, self.height), resample=self.resample))
      scaled = (resized.astype(np.float64) * self.rescale).astype(np.float32)
      return ((scaled - mean) / std).transpose(2, 0, 1)
    return np.stack([one(p) for p in parts])

  def expand(self, text: str, crops: list[int]) -> str:
    """`text` with its image markers (`begin`, one per image, in order)
    written out: each image's soft tokens, and an image with crops
    introduced, then followed by its crops' own."""
    pieces = text.split(self.begin)
    if len(pieces) - 1 != len(crops):
      raise UsageError(f'the text has {len(pieces) - 1} image markers '
                       f'({self.begin}) for {len(crops)} images.')
    one = (f'\n\n{self.begin}{self.soft * self.image_seq_length}'
           f'{self.end}\n\n')
    out = pieces[0]
    for count, piece in zip(crops, pieces[1:]):
      if count:
        out += (f'Here is the original image {one} and here are some crops '
                'to help you see better ' + ' '.join([one] * count))
      else:
        out += one
      out += piece
    return out


def _json(path: str) -> dict[str, Any]:
  """The JSON object in `path` ({} when there is no such file)."""
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    return {}
  except (OSError, ValueError) as e:
    raise UsageError(f'cannot read {path} ({e}).') from None
