"""An LLM as judge (the `judge` reward): a frozen model on the rollout mesh
reads each sample through a fixed prompt template and answers with a
score.

`--config.rl.judge` names the model (a Hugging Face checkpoint or a
trained workdir); `rl.judge_template` has `{prompt}` and `{completion}`
fields; the judge decodes greedily up to `rl.judge_max_new_tokens`; the
first number of its answer over `rl.judge_scale` is the reward. An answer
with no number, or one outside [0, judge_scale], is malformed: it scores
`rl.judge_malformed` and is counted (`judge_malformed` per step); so is an
ask longer than `rl.judge_max_prompt_length` tokens, which the judge does
not read (a step's asks are one batch of prompts up to that bound: the
program the compile plan holds, `rl/plan.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import re
from typing import Any

import numpy as np

from tunix_pw.errors import UsageError
from tunix_pw.models import blocks, tokenizers
from tunix_pw.runtime.fetch import fetch
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.sampling.sampler import make_sampler
from tunix_pw.train import setup

_NUMBER = re.compile(r'-?\d+(?:\.\d+)?')


def check(rl: Any) -> None:
  for field in ('{prompt}', '{completion}'):
    if field not in rl.judge_template:
      raise UsageError(f'--config.rl.judge_template needs a {field} field.')
  if rl.judge_scale <= 0 or min(rl.judge_max_new_tokens,
                                rl.judge_max_prompt_length) < 1:
    raise UsageError(f'--config.rl.judge_scale={rl.judge_scale} must be '
                     'positive and --config.rl.judge_max_new_tokens and '
                     'judge_max_prompt_length at least 1.')


def parse(answer: str, scale: float) -> float | None:
  """The judge's first number over `scale`, or None when it is malformed
  (no number, or one outside [0, scale])."""
  match = _NUMBER.search(answer)
  if not match:
    return None
  value = float(match.group())
  return value / scale if 0 <= value <= scale else None


class Judge:
  """(prompts, completions) -> (rewards [N], malformed count), from
  `answers(texts) -> judge answers` (the model's greedy decode)."""

  def __init__(self, answers: Callable[[list[str]], list[str]], rl: Any):
    self.answers, self.rl = answers, rl

  def __call__(self, prompts: Sequence[str],
               completions: Sequence[str]) -> tuple[np.ndarray, int]:
    asks = [self.rl.judge_template.format(prompt=p, completion=c)
            for p, c in zip(prompts, completions)]
    scores = [parse(a, self.rl.judge_scale) for a in self.answers(asks)]
    return (np.asarray([self.rl.judge_malformed if s is None else s
                        for s in scores], np.float32),
            sum(s is None for s in scores))


def model_block(config: Any) -> Any:
  """The model block of `--config.rl.judge` (its own tokenizer)."""
  block = config.model.copy_and_resolve_references()
  block.checkpoint, block.tokenizer = config.rl.judge, ''
  return block


def sampling(rl: Any) -> SamplingConfig:
  return SamplingConfig(max_new_tokens=rl.judge_max_new_tokens, greedy=True)


def build(config: Any, meshes: Any, runtime: Any) -> Judge:
  """The judge of `--config.rl.judge`, greedy, on the rollout mesh."""
  rl, mesh, block = config.rl, meshes['rollout'], model_block(config)
  model, _ = setup.model_from_block(block, seed=config.seed, mesh=mesh,
                                    rules=config.sharding)
  tokenizer = blocks.tokenizer(block)
  bound = rl.judge_max_prompt_length
  sampler = make_sampler(model, tokenizer, mesh=mesh, rules=config.sharding,
                         runtime=runtime,
                         max_cache=bound + rl.judge_max_new_tokens)

  def answers(texts: list[str]) -> list[str]:
    asks = [tokenizers.encode_prompt(tokenizer, t, rl.judge_chat)
            for t in texts]
    unread = [len(a) > bound for a in asks]  # answered '': malformed
    out = sampler.generate([a[:1] if u else a for a, u in zip(asks, unread)],
                           sampling(rl))
    tokens, lengths = fetch((out.tokens, out.lengths))
    return ['' if unread[r] else tokenizer.decode(
        [t for t in tokens[r, :lengths[r]] if t not in tokenizer.stop_ids])
            for r in range(len(texts))]

  return Judge(answers, rl)
