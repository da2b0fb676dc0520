"""How far a config's static checks reach.

By default they read what the config names: the checkpoint directory, the
dataset's files. Two callers check less, for the span of a `with`:
- the XPK launcher, `files=False`: the checkpoints and data live in the
  cluster's images and mounts, not on the machine that submits;
- compile-only checks, `files=False, data=False`: they compile from shapes,
  so a config needs no dataset at all.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Any

from tunix_pw.errors import UsageError


@dataclasses.dataclass(frozen=True)
class Scope:
  files: bool = True  # the checkpoints and data files a config names exist
  data: bool = True  # a dataset that needs a manual_dir names one


_scope = contextvars.ContextVar('scope', default=Scope())


def scope() -> Scope:
  return _scope.get()


@contextlib.contextmanager
def limited(**fields: bool) -> Iterator[None]:
  token = _scope.set(dataclasses.replace(scope(), **fields))
  try:
    yield
  finally:
    _scope.reset(token)


def not_negative(block: Any, prefix: str, *fields: str) -> None:
  """Each named integer field of `block` is at least 0 (0: a default)."""
  for field in fields:
    value = block[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      raise UsageError(f'{prefix}.{field}={value!r} must be an integer of at '
                       'least 0.')


def at_least_one(block: Any, prefix: str, *fields: str) -> None:
  """Each named integer field of `block` is at least 1 (sizes, counts and
  cadences that the jobs divide by)."""
  for field in fields:
    value = block[field]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise UsageError(f'{prefix}.{field}={value!r} must be an integer of at '
                       'least 1.')
