"""SFT: supervised fine-tuning (full or LoRA/QLoRA), one explicit loop.

data -> (packed or bucketed) batches on the actor mesh -> train step
(gradient accumulation, loss on completion tokens) -> metrics -> periodic
greedy exact-match evaluation -> checkpoint -> preemption check.
"""

from __future__ import annotations

import concurrent.futures
import functools
from typing import Any

import numpy as np

from tunix_pw.agents import envs, episodes as episodes_lib, runs
from tunix_pw.rl import rewards
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.train import plans, program, supervised


def validate(config: Any) -> None:
  supervised.check(config)
  if 'agent' in config:  # demonstration episodes
    envs.check(config.agent)
  rewards.verifier(config.eval_verifier)


def compile_plan(config: Any, meshes: meshes_lib.RoleMeshes):
  """The train step from shapes, for compile-only checks (a batch of full
  `max_length` rows, as packing or several processes make it), and the
  held-out evaluation's (an agent's: its turns, contexts up to what
  leaves room to answer)."""
  policy = supervised.plan(config, meshes, abstract=True)
  shape = (config.batch_size, config.data.max_length)
  batch = plans.batch_on(policy.mesh, config.sharding, {
      k: (shape, np.int32)
      for k in ('tokens', 'positions', 'segment_ids', 'loss_mask')})
  out = plans.Plan({'actor': program.resident(policy)},
                   [program.train_phase(policy, batch)])
  if 'agent' not in config:
    return supervised.evaluation_plan(config, policy, out)
  return supervised.evaluation_plan(
      config, policy, out, episodes_lib.batch(
          min(config.eval_batch_size, config.eval_examples),
          runs.quantum(policy.mesh, config.sharding)),
      config.data.max_length - config.eval_max_new_tokens)


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  if 'agent' not in config:
    supervised.run(config, runtime, meshes, workdir, preemption,
                   evaluation=functools.partial(
                       supervised.exact_match, config,
                       rewards.verifier(config.eval_verifier)))
    return
  data = config.data
  supervised.run(
      config, runtime, meshes, workdir, preemption,
      evaluation=functools.partial(episodes, config),
      transform=lambda tokenizer: episodes_lib.sft_transform(
          config.agent, tokenizer, data.max_length, data.overlong))


def episodes(config: Any, source: Any, sampler: Any, tokenizer: Any,
             mesh: Any, processing: Any = None):
  """An agent's warm-up evaluation: one greedy episode per held-out
  problem, and the tools' threads (text episodes: no `processing`)."""
  del processing
  tools = concurrent.futures.ThreadPoolExecutor(config.eval_batch_size)
  return functools.partial(
      runs.evaluate_episodes, runs.collector(
          config.agent, sampler, tokenizer, mesh, config.sharding,
          SamplingConfig(config.eval_max_new_tokens, greedy=True),
          config.data.max_length - config.eval_max_new_tokens,
          config.eval_batch_size, tools),
      runs.examples(source, config.eval_examples), config.seed), tools
