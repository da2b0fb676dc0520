"""Reading and writing .safetensors files without a framework.

Tensors are memory-mapped: a loader slices exactly the part a device needs
(through transposes, which stay views), so a checkpoint never sits on the
host whole. bfloat16 is read and written through ml_dtypes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
import json
import os
import struct

import ml_dtypes
import numpy as np

from tunix_pw.errors import UsageError

DTYPES = {
    'F64': np.dtype(np.float64), 'F32': np.dtype(np.float32),
    'F16': np.dtype(np.float16), 'BF16': np.dtype(ml_dtypes.bfloat16),
    'I64': np.dtype(np.int64), 'I32': np.dtype(np.int32),
    'I16': np.dtype(np.int16), 'I8': np.dtype(np.int8),
    'U8': np.dtype(np.uint8), 'BOOL': np.dtype(np.bool_),
}
_NAMES = {v: k for k, v in DTYPES.items()}
INDEX = 'model.safetensors.index.json'


def _header(path: str) -> tuple[dict, int]:
  try:
    with open(path, 'rb') as f:
      (size,) = struct.unpack('<Q', f.read(8))
      if size > os.path.getsize(path) - 8:
        raise ValueError(f'header of {size} bytes exceeds the file')
      header = json.loads(f.read(size))
    if not isinstance(header, dict):
      raise ValueError('the header is not a JSON object')
    header.pop('__metadata__', None)
    for name, info in header.items():
      if not (isinstance(info, dict) and isinstance(info.get('dtype'), str)
              and _ints(info.get('shape')) and
              _ints(info.get('data_offsets'), 2)):
        raise ValueError(f'tensor {name!r} has no dtype, shape and '
                         'data_offsets')
  except (OSError, ValueError, struct.error) as e:
    raise UsageError(f'{path} is not a readable safetensors file '
                     f'({type(e).__name__}: {e}).') from None
  return header, 8 + size


def _ints(value, length: int | None = None) -> bool:
  return (isinstance(value, list) and (length is None or len(value) == length)
          and all(isinstance(v, int) and v >= 0 for v in value))


def _shards(directory: str) -> list[str]:
  """The shard files an index lists: plain file names in `directory`
  (a name such as '../other/model.safetensors' would read another
  checkpoint)."""
  index = os.path.join(directory, INDEX)
  try:
    with open(index) as f:
      weight_map = json.load(f)['weight_map']
    files = sorted(set(weight_map.values()))
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise UsageError(f'{index} is not a readable safetensors index '
                     f'({type(e).__name__}: {e}).') from None
  for name in files:
    if not isinstance(name, str) or os.path.basename(name) != name or (
        name in ('', '.', '..')):
      raise UsageError(f'{index} names the shard {name!r}, which is not a '
                       f'file name inside {directory}.')
  return files


class SafetensorsDir:
  """The tensors of a checkpoint directory: one model.safetensors, or shards
  listed in model.safetensors.index.json (or any *.safetensors files)."""

  def __init__(self, directory: str):
    self.directory = directory
    if os.path.exists(os.path.join(directory, INDEX)):
      files = _shards(directory)
    else:
      files = sorted(f for f in os.listdir(directory)
                     if f.endswith('.safetensors'))
    if not files:
      raise UsageError(f'{directory} has no .safetensors files.')
    self.where: dict[str, tuple[str, dict, int]] = {}
    for name in files:
      path = os.path.join(directory, name)
      header, start = _header(path)
      for tensor, info in header.items():
        self.where[tensor] = (path, info, start)

  def names(self) -> list[str]:
    return list(self.where)

  def get(self, name: str) -> np.ndarray:
    """The tensor as a read-only memory map (no bytes read yet)."""
    if name not in self.where:
      raise UsageError(f'tensor {name!r} is missing from the checkpoint in '
                       f'{self.directory}.')
    path, info, start = self.where[name]
    dtype = DTYPES.get(info['dtype'])
    if dtype is None:
      raise UsageError(f'tensor {name!r} in {path} has unsupported dtype '
                       f'{info["dtype"]}.')
    begin, end = info['data_offsets']
    shape = tuple(info['shape'])
    if end - begin != int(np.prod(shape)) * dtype.itemsize or (
        start + end > os.path.getsize(path)):
      raise UsageError(f'tensor {name!r} in {path} is truncated or corrupt '
                       f'(shape {shape}, {end - begin} bytes).')
    return np.memmap(path, dtype=dtype, mode='r', offset=start + begin,
                     shape=shape)

  def file_of(self, name: str) -> str:
    return self.where[name][0] if name in self.where else self.directory


def save(path: str, tensors: Mapping[str, np.ndarray] | Iterator) -> None:
  """Writes one .safetensors file (tensors in the given order)."""
  items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
  header, offset = {}, 0
  for name, array in items:
    header[name] = dict(dtype=_NAMES[np.dtype(array.dtype)],
                        shape=list(array.shape),
                        data_offsets=[offset, offset + array.nbytes])
    offset += array.nbytes
  blob = json.dumps(header, separators=(',', ':')).encode()
  blob += b' ' * (-len(blob) % 8)  # keep tensor data 8-byte aligned
  tmp = path + '.tmp'
  with open(tmp, 'wb') as f:
    f.write(struct.pack('<Q', len(blob)))
    f.write(blob)
    for _, array in items:
      f.write(np.ascontiguousarray(array).tobytes())
  os.replace(tmp, path)  # never a half-written checkpoint
