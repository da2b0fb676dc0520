"""Name -> object registries, one per kind: `@register('advantage',
'grpo')`. Losses, advantages, rewards, verifiers, strategies,
environments, agent tools and jobs are all registered here.

Configs name them; `check` turns an unknown name into a config error
listing the registered ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunix_pw.errors import UsageError

KINDS = ('advantage', 'policy_loss', 'aggregation', 'kl', 'reward',
         'preference_loss', 'distill_divergence', 'distill_strategy',
         'verifier', 'environment', 'tool', 'job')
_REGISTRY: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}


def register(kind: str, name: str) -> Callable[[Any], Any]:
  def decorate(entry: Any) -> Any:
    if name in _REGISTRY[kind]:
      raise ValueError(f'{kind} {name!r} is registered twice')
    _REGISTRY[kind][name] = entry
    return entry
  return decorate


def get(kind: str, name: str) -> Any:
  return _REGISTRY[kind][name]


def names(kind: str) -> list[str]:
  return sorted(_REGISTRY[kind])


def check(kind: str, name: str, field: str) -> None:
  if name not in _REGISTRY[kind]:
    raise UsageError(f'{field}={name!r} is not a registered {kind}; use one '
                     f'of {", ".join(names(kind))}.')
