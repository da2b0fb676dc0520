"""Name -> function registries: `@register('advantage', 'grpo')`.

Configs name functions; `check` turns an unknown name into a config error
listing the registered ones.
"""

from __future__ import annotations

from collections.abc import Callable

from tunix_pw.errors import UsageError

KINDS = ('advantage', 'policy_loss', 'aggregation', 'kl', 'reward',
         'preference_loss', 'distill_divergence', 'distill_strategy')
_REGISTRY: dict[str, dict[str, Callable]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str) -> Callable[[Callable], Callable]:
  def decorate(fn: Callable) -> Callable:
    if name in _REGISTRY[kind]:
      raise ValueError(f'{kind} {name!r} is registered twice')
    _REGISTRY[kind][name] = fn
    return fn
  return decorate


def get(kind: str, name: str) -> Callable:
  return _REGISTRY[kind][name]


def names(kind: str) -> list[str]:
  return sorted(_REGISTRY[kind])


def check(kind: str, name: str, field: str) -> None:
  if name not in _REGISTRY[kind]:
    raise UsageError(f'{field}={name!r} is not a registered {kind}; use one '
                     f'of {", ".join(names(kind))}.')
