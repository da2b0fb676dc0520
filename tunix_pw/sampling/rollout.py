"""The rollout interface: what RL needs from a generation engine.

The built-in `Sampler` implements it. An external engine (vLLM or SGLang-JAX
on TPU) plugs in by implementing the same two methods: `generate` returns
`Completions` (tokens, log-probabilities, masks, lengths), and
`update_weights` takes the actor's parameters after each step (the full tree,
or LoRA adapters only) and makes the engine serve them.
"""

from __future__ import annotations

from collections.abc import Sequence
import dataclasses
from typing import Any, Protocol

import jax

from tunix_pw.errors import UsageError


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How to pick tokens. temperature 0 or greedy=True is argmax."""

  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0  # 0: off
  top_p: float = 1.0  # 1: off
  greedy: bool = False
  seed: int = 0
  stop_ids: tuple[int, ...] = ()  # besides the tokenizer's own
  ignore_eos: bool = False  # benchmarks: always generate max_new_tokens
  # Completions per prompt, rows prompt-major: G rows of prompt 0, then
  # prompt 1's... (GRPO's groups), sharing each prompt's prefill.
  generations: int = 1

  def __post_init__(self):
    if self.max_new_tokens <= 0:
      raise UsageError(f'max_new_tokens={self.max_new_tokens} must be at '
                       'least 1.')
    if not 0.0 < self.top_p <= 1.0:
      raise UsageError(f'top_p={self.top_p} must be in (0, 1].')
    if self.generations < 1:
      raise UsageError(f'generations={self.generations} must be at least '
                       '1.')
    if self.top_k < 0 or self.temperature < 0:
      raise UsageError(f'top_k={self.top_k} and temperature='
                       f'{self.temperature} must not be negative.')

  @classmethod
  def from_block(cls, block: Any) -> SamplingConfig:
    """A config's sampling block (its checks are usage errors)."""
    try:
      return cls(max_new_tokens=block.max_new_tokens,
                 temperature=block.temperature, top_k=block.top_k,
                 top_p=block.top_p, seed=block.seed)
    except UsageError as e:
      raise UsageError(f'--config.sampling: {e}') from None

  @property
  def is_greedy(self) -> bool:
    return self.greedy or self.temperature == 0.0


@dataclasses.dataclass(frozen=True)
class Completions:
  """Generated tokens per row (`generations` rows per prompt),
  right-padded to a common length.

  tokens, logprobs, mask: [B, N]; lengths: [B]. `mask` covers the generated
  tokens, the stop token included; `logprobs` is the log-softmax of the
  logits over the temperature (the policy that sampled, before top-k and
  top-p) at each generated token; `versions` [B, N] (host), the
  version of the weights that produced each token (an engine that takes
  new weights between decode chunks), or None: all the version it started
  from; `log_kept` [B, N], the log of the probability mass top-k and top-p
  kept at each token (0 untruncated; its negation is KL(truncated ||
  full)), or None when the engine does not report it."""

  tokens: jax.Array
  logprobs: jax.Array
  mask: jax.Array
  lengths: jax.Array
  versions: Any = None
  log_kept: Any = None


class RolloutEngine(Protocol):

  def generate(self, prompts: Sequence[Sequence[int]],
               sampling: SamplingConfig) -> Completions:
    ...

  def update_weights(self, params: Any, version: int | None = None) -> None:
    ...
