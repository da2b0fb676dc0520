"""Agentic RL: multi-turn episodes with tools, trained as GRPO groups.

Each step draws `rl.prompts_per_step` examples and plays
`rl.num_generations` episodes of each (`agents/episodes.py`: concurrent,
each model turn sampled by the rollout engine, each tool call run under
its time limit); an episode is one training sequence whose loss covers the
model's own tokens, and its reward (the sum of its turns') is compared
within its group. The update, the reference, the weight sync, checkpoints
and preemption are GRPO's (`rl/trainer.py`). Held-out evaluation plays one
greedy episode per problem.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
from typing import Any

import numpy as np

from tunix_pw.agents import envs as envs_lib, episodes as episodes_lib, runs
from tunix_pw.data import pipeline
from tunix_pw.errors import InfrastructureError, UsageError
from tunix_pw.rl import config_checks, functions, phases, trainer
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.train import plans, setup

REWARDS = {'': [('exact_answer', 1.0)]}  # the environment's, per episode


def validate(config: Any) -> None:
  config_checks.validate(config)
  envs_lib.check(config.agent)
  agent, rl = config.agent, config.rl
  for field in ('max_turns', 'max_concurrent', 'tool_timeout',
                'episode_timeout'):
    if agent[field] <= 0:
      raise UsageError(f'--config.agent.{field}={agent[field]} must be '
                       'positive.')
  if rl.dynamic_sampling or functions.token_advantage(rl.advantage) or (
      config.mixture or rl.tree.chains):
    raise UsageError('agentic RL compares the episodes of a group by their '
                     'rewards: it takes no --config.rl.dynamic_sampling, '
                     'per-token advantage, --config.rl.tree or '
                     '--config.mixture.')




def _keep(example: dict[str, Any], counters: pipeline.Counters):
  counters.examples += 1
  return example


class Agent:
  """The episodes of a run: collectors for training (sampled) and
  held-out evaluation (greedy), and their tools' threads."""

  def __init__(self, config: Any, sampler: Any, tokenizer: Any, mesh: Any):
    agent, rl = config.agent, config.rl
    self.config, self.tools = config, concurrent.futures.ThreadPoolExecutor(
        max(agent.max_concurrent, config.eval_batch_size), 'tool')
    sampling = phases.sampling(rl)
    make = lambda sampling, concurrent: runs.collector(
        agent, sampler, tokenizer, mesh, config.sharding, sampling,
        rl.max_prompt_length, concurrent, self.tools)
    self.train = make(sampling, agent.max_concurrent)
    self.eval = make(dataclasses.replace(sampling, greedy=True),
                     config.eval_batch_size)

  def rollout(self, data: Any, index: int) -> phases.Rollout:
    """One step's groups: G episodes of each of the step's examples."""
    g, seed = self.config.rl.num_generations, self.config.seed
    batch = next(data)
    rng = np.random.default_rng((seed, index))
    starts = [envs_lib.wrong_start(self.train.task, e, rng)
              if rng.random() < self.config.agent.practice else []
              for e in batch]  # a group's episodes share theirs
    found, counts = self.train.collect(
        [e for e in batch for _ in range(g)], seed * 1_000_003 + index,
        self.config.agent.lockstep, [s for s in starts for _ in range(g)])
    groups = episodes_lib.to_groups(found, g)
    return phases.Rollout(groups, group_weights(
        found, g, self.config.agent.max_sandbox_failures), dict(
        runs.metrics(found, counts), dropped=0, padded=0, rounds=0,
        reward_errors=0, generated=sum(sum(e.transcript.mask)
                                       for e in found)))

  def evaluate(self, parts: trainer.Parts,
               heldout: list[dict[str, Any]]) -> dict[str, float]:
    del parts
    return runs.evaluate_episodes(self.eval, heldout, self.config.seed)


def group_weights(episodes: list[episodes_lib.Episode], size: int,
                  max_failed: float) -> list[float]:
  """1 per group of `size` episodes; 0 where an episode's code sandbox could
  not start (its reward says nothing of the model). InfrastructureError
  when more than `max_failed` of the groups are so."""
  weights = [0.0 if any(e.info['sandbox_failures']
                        for e in episodes[i:i + size]) else 1.0
             for i in range(0, len(episodes), size)]
  failed = weights.count(0.0)
  if failed > max_failed * len(weights):
    raise InfrastructureError(
        f'the code sandbox failed to start in {failed} of this step\'s '
        f'{len(weights)} groups, more than --config.agent.'
        f'max_sandbox_failures={max_failed} allows; see the log for why.')
  return weights


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  common = trainer.engines(config, runtime, meshes)
  spec = pipeline.DataSpec.from_block(config.data)
  sources, _ = pipeline.prepare(spec, runtime)
  data = pipeline.Pipeline(
      sources['train'], _keep, batch_size=config.rl.prompts_per_step,
      seed=config.seed, num_epochs=None,
      what=f'the train split of {spec.name}')
  agent = Agent(config, common['sampler'], common['tokenizer'],
                meshes['rollout'])
  parts = trainer.Parts(data=data, reward_weights=REWARDS,
                     collect=lambda index: agent.rollout(data, index),
                     **common)
  try:
    state = trainer.train(parts, runs.examples(sources['test'],
                                        config.eval_examples),
                       workdir, preemption, parts.plan.policy.state,
                       trainer.step, name='agentic',
                       evaluate_fn=agent.evaluate)
  finally:
    agent.tools.shutdown(wait=False, cancel_futures=True)
  if config.export:
    setup.export(config, parts.plan.policy.model(state.params))


def turn_phases(config: Any, rollout_model: Any,
                rollout_mesh: Any) -> list[plans.Phase]:
  """What the rollout engine generates: the training episodes' turns
  (sampled; up to agent.max_concurrent at once, or a step's every episode
  in lockstep) and the held-out episodes' (greedy), each turn's context up
  to the collector's bound (`rl.max_prompt_length`)."""
  rl, agent, rules = config.rl, config.agent, config.sharding
  episodes = rl.prompts_per_step * rl.num_generations
  playing = episodes if agent.lockstep else min(agent.max_concurrent,
                                                 episodes)
  sampling = phases.sampling(rl)
  turns = [('agent turns', playing, sampling)]
  if config.eval_examples:
    turns.append(('held-out turns', min(config.eval_batch_size,
                                        config.eval_examples),
                  dataclasses.replace(sampling, greedy=True)))
  return [plans.generation_phase(
      name, 'rollout', rollout_model, rollout_mesh, rules,
      episodes_lib.batch(n, runs.quantum(rollout_mesh, rules)),
      rl.max_prompt_length, how) for name, n, how in turns]


compile_plan = functools.partial(trainer.compile_plan, generation=turn_phases)
