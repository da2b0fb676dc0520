"""An agent's episodes in a job: collectors that play them on a sampler,
the held-out evaluation (one greedy episode per problem) and the
episodes' metrics; used by the agentic job and an agent's SFT warm-up."""

from __future__ import annotations

from collections import Counter
import concurrent.futures
import math
from typing import Any

from tunix_pw.agents import envs as envs_lib, episodes as episodes_lib
from tunix_pw.data import builders
from tunix_pw.train import evaluate


def examples(source: Any, count: int) -> list[dict[str, Any]]:
  """The first `count` examples of a split, as they are."""
  return [dict(builders.decode(source[i]), index=i)
          for i in range(min(count, len(source)))]


def quantum(mesh: Any, rules: Any) -> int:
  """The mesh's data shards: a batch of turns is a multiple of them."""
  return math.prod(mesh.shape.get(a, 1) for a in rules.batch.split(','))


def collector(agent: Any, sampler: Any, tokenizer: Any, mesh: Any,
              rules: Any, sampling: Any, max_context: int,
              max_concurrent: int,
              tools: concurrent.futures.Executor) -> episodes_lib.Collector:
  """Episodes of --config.agent's task, each model turn sampled by
  `sampler` (batches padded to a multiple of `mesh`'s data shards)."""
  return episodes_lib.Collector(
      episodes_lib.sampler_generate(sampler, sampling, quantum(mesh, rules)),
      envs_lib.task(agent, tokenizer, tools), tokenizer, agent, max_context,
      max_concurrent)


def evaluate_episodes(collector: episodes_lib.Collector,
                      examples: list[dict[str, Any]],
                      seed: int) -> dict[str, float]:
  """One episode per held-out problem: accuracy (with its 95% interval)
  and the episodes' metrics, as eval/ scalars."""
  found, counts = collector.collect(examples, seed)
  correct = int(sum(e.solved for e in found))
  low, high = evaluate.wilson_interval(correct, len(found))
  return dict({f'eval/{k}': v for k, v in metrics(found, counts).items()},
              **{'eval/accuracy': correct / max(len(found), 1),
                 'eval/correct': correct, 'eval/total': len(found),
                 'eval/ci_low': low, 'eval/ci_high': high})


def metrics(episodes: list[episodes_lib.Episode],
            counts: Counter) -> dict[str, float]:
  """The counts, with the fraction of calls that parsed, turns per episode
  and the fraction of episodes that called a tool; with retries, the
  fraction of wrong first answers that a later attempt fixed."""
  n = max(len(episodes), 1)
  calls = counts['tool_calls'] + counts['malformed_calls']
  out = dict(counts, well_formed_calls=counts['tool_calls'] / max(calls, 1),
             turns_per_episode=counts['model_turns'] / n,
             tool_use=sum(e.info['tool_calls'] > 0 for e in episodes) / n)
  if {'first_right', 'corrected', 'wrong_answers'} & set(counts):
    out.update(first_right_fraction=counts['first_right'] / n,
               fix_rate=counts['corrected'] / max(
                   len(episodes) - counts['first_right'], 1))
  return out
