"""The RL trainer every RL job runs (grpo and its variants, ppo, agentic):
its parts, built once (`engines`, `build`); a step's phases (rollout and
rewards -> reference and old log-probabilities -> mini-batch updates ->
weight sync -> metrics, `step`); the loop with evaluation, checkpoints and
preemption checks (`train`); and the compile plan of the same programs
(`compile_plan`). `rl/plan.py` builds the programs once, for the run and
for compile-only checks alike.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
import time
from typing import Any

from flax import nnx
import jax
import numpy as np

from tunix_pw import console
from tunix_pw.models import blocks
from tunix_pw.rl import asynchronous, batch as batch_lib, judge as judge_lib
from tunix_pw.rl import plan as plan_lib, prompts as prompts_lib
from tunix_pw.rl import functions, phases, reward_model, rewards
from tunix_pw.runtime import backend, meshes as meshes_lib, reshard
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.sampling.sampler import Sampler, make_sampler
from tunix_pw.train import evaluate, loop, plans, program, scoring


@dataclasses.dataclass(frozen=True)
class Parts:
  """What a run's steps use, built once by `run`."""

  config: Any
  runtime: backend.Runtime
  plan: plan_lib.Plan
  sampler: Sampler  # the rollout engine, on the rollout mesh
  reference: scoring.Scorer | None  # on-policy distillation's teacher
  reference_logps: Callable | None  # its program: {'ref_logps': ..., ...}
  tokenizer: Any
  data: Any  # the prompt pipeline, or a mixture of several
  reward_weights: dict[str, list[tuple[str, float]]]  # dataset -> weights
  scorers: batch_lib.Scorers = batch_lib.Scorers()  # reward model, judge
  # step -> the step's scored groups, in place of single completions of
  # `data`'s prompts (an agent's episodes, jobs/agentic.py)
  collect: Callable[[int], phases.Rollout] | None = None


def rollout_engine(config: Any, programs: plan_lib.Plan, tokenizer: Any,
                   meshes: meshes_lib.RoleMeshes, runtime: Any) -> Sampler:
  """A copy of the policy on the rollout mesh, owned by the engine alone
  (weight syncs then free the previous copy)."""
  copy, _ = reshard.transfer(nnx.state(programs.policy.model()),
                             programs.rollout_shardings, runtime,
                             budget=programs.sync)
  return make_sampler(
      nnx.merge(programs.policy.full_graphdef, copy), tokenizer,
      mesh=meshes['rollout'], rules=config.sharding, runtime=runtime,
      max_cache=config.rl.max_prompt_length + config.rl.max_new_tokens,
      sync_budget=programs.sync, decode_chunk=config.rl.decode_chunk)


def log_probs(parts: Parts, state: Any,
              arrays: dict[str, np.ndarray]) -> dict[str, jax.Array]:
  """The reference's and the rollout policy's log-probabilities that the
  update needs, on the actor mesh."""
  config, programs = parts.config, parts.plan
  rules, size = config.sharding, config.rl.logps_micro_batch_size
  extra = {}
  if parts.reference is not None:
    extra.update(phases.chunked_logps(
        parts.reference_logps, parts.reference.state, arrays,
        parts.reference.mesh, rules, size))
  if 'old_logps' in programs.needed:
    actor = programs.policy.mesh
    extra['old_logps'] = phases.chunked_logps(
        programs.logps(actor), nnx.state(programs.policy.model(state.params)),
        arrays, actor, rules, size)
  return phases.to_actor(extra, programs.policy.mesh, rules, parts.runtime,
                         programs.sync)


def rollout_stages(parts: Parts, index: int) -> Callable[[], phases.Rollout]:
  """Step `index`'s rollout, generated now; the function returned scores
  it (an agent's episodes are scored as they are collected)."""
  if parts.collect:
    result = parts.collect(index)
    return lambda: result
  return phases.rollout(parts.sampler, parts.data, parts.tokenizer,
                        parts.config.rl, parts.reward_weights,
                        parts.config.seed, index, parts.scorers)


def training_inputs(parts: Parts, state: Any, result: phases.Rollout,
                    preemption: Preemption, stop: Callable[[], None],
                    timer: phases.Timer):
  """A step's phases between the rollout and the update: the training
  arrays (with any importance weights, on the host), the
  log-probabilities the update needs (on the actor mesh) and the mismatch
  metrics."""
  config, rl = parts.config, parts.config.rl
  preemption.check(stop)
  with timer('logps'):
    arrays = phases.training_arrays(
        result, rl, rl.max_prompt_length + rl.max_new_tokens,
        parts.tokenizer.pad_id)
    extra = log_probs(parts, state, arrays)
    source = functions.token_advantage(rl.advantage)
    if source and source.of_logps:  # each token's, from its scorer's
      scale = config.distill.token_weight if 'distill' in config else 1.0
      extra['advantages'] = scale * source.of_logps(extra['ref_logps'],
                                                    extra['old_logps'])
    weights, mismatch = phases.rollout_correction(
        result, arrays, extra.get('old_logps'), rl)
  preemption.check(stop)
  return dict(arrays, **weights), extra, mismatch


def update_policy(parts: Parts, state: Any, arrays: dict[str, np.ndarray],
                  extra: dict[str, Any]) -> tuple[Any, dict[str, float]]:
  """The policy's mini-batch updates on the actor mesh."""
  config, mesh = parts.config, parts.plan.policy.mesh
  batch = dict(phases.on_mesh(arrays, mesh, config.sharding), **extra)
  return phases.update(state, parts.plan.policy.train_step, batch,
                       config.rl, mesh, config.sharding)


def step(parts: Parts, state: Any, index: int, result: phases.Rollout,
         timer: phases.Timer, preemption: Preemption,
         stop: Callable[[], None]) -> tuple[Any, dict[str, float]]:
  """Step `index` on its scored rollout, phase by phase, with preemption
  checks between them; `timer` holds the rollout's time."""
  arrays, extra, mismatch = training_inputs(parts, state, result,
                                            preemption, stop, timer)
  with timer('train'):
    state, update_metrics = update_policy(parts, state, arrays, extra)
  with timer('weight_sync'):
    parts.sampler.update_weights(state.params, version=index + 1)
  return state, phases.step_metrics(result, dict(update_metrics, **mismatch),
                                    timer, parts.sampler.last_sync,
                                    parts.reward_weights)


def engines(config: Any, runtime: backend.Runtime,
            meshes: meshes_lib.RoleMeshes) -> dict[str, Any]:
  """The Parts every RL run has, whatever it rolls out: the programs, the
  tokenizer, the rollout engine, the reference (or teacher) scorer."""
  programs = plan_lib.plan(config, meshes, abstract=False)
  tokenizer = blocks.tokenizer(config.model)
  sampler = rollout_engine(config, programs, tokenizer, meshes, runtime)
  reference = reference_logps = None
  if plan_lib.from_teacher(config.rl):
    reference = scoring.from_block(
        config.teacher, scoring.reference_mesh(config, meshes),
        config.sharding, config.seed)
    reference_logps = plan_lib.make_teacher(config, reference.mesh,
                                            reference.graphdef)
  elif 'ref_logps' in programs.needed:
    reference = scoring.reference(config, programs.policy, meshes, runtime)
    logps = programs.logps(reference.mesh)
    reference_logps = lambda state, rows: dict(ref_logps=logps(state, rows))
  return dict(config=config, runtime=runtime, plan=programs, sampler=sampler,
              reference=reference, reference_logps=reference_logps,
              tokenizer=tokenizer)


def build(config: Any, runtime: backend.Runtime,
          meshes: meshes_lib.RoleMeshes) -> tuple[Parts, dict[str, Any]]:
  """A run's parts and its held-out sets."""
  common = engines(config, runtime, meshes)
  data, heldout, reward_weights = prompts_lib.prompts(config, runtime,
                                                     common['tokenizer'])
  scorers = batch_lib.Scorers(
      reward_model.scorer(config, meshes) if config.rl.reward_model
      else None,
      judge_lib.build(config, meshes, runtime) if config.rl.judge else None)
  return Parts(data=asynchronous.Lookahead(data),
               reward_weights=reward_weights, scorers=scorers,
               **common), heldout


def evaluate_sets(parts: Parts, heldout: dict[str, Any]) -> dict[str, float]:
  """Greedy accuracy (with pass@k and maj@k when --config.eval_k) on each
  held-out set; a mixture's sets are also pooled."""
  config, out = parts.config, {}
  sampling = dataclasses.replace(
      phases.sampling(config.rl, config.seed),
      temperature=config.eval_temperature) if config.eval_k else None
  verifier = rewards.verifier(config.eval_verifier, config.rl.rewards)
  for name, (prompts_ids, answers, pixels) in heldout.items():
    result = evaluate.exact_match(parts.sampler, parts.tokenizer, prompts_ids,
                                  answers, config.rl.max_new_tokens,
                                  config.eval_batch_size, verifier, pixels)
    if sampling:
      result.update(evaluate.sampled(
          parts.sampler, parts.tokenizer, prompts_ids, answers,
          config.eval_k, config.eval_n or config.eval_k, sampling,
          config.eval_batch_size, verifier))
    out.update({f'eval/{name}/{k}' if name else f'eval/{k}': v
                for k, v in result.items()})
  if len(heldout) > 1:
    correct = sum(out[f'eval/{n}/correct'] for n in heldout)
    total = sum(out[f'eval/{n}/total'] for n in heldout)
    low, high = evaluate.wilson_interval(int(correct), int(total))
    out.update({'eval/accuracy': correct / max(total, 1),
                'eval/correct': correct, 'eval/total': total,
                'eval/ci_low': low, 'eval/ci_high': high})
  return out


def train(parts: Parts, heldout: dict[str, Any], workdir: str,
          preemption: Preemption, state: Any, step_fn: Callable,
          name: str = 'grpo', evaluate_fn: Callable = evaluate_sets) -> Any:
  """The loop from `state` (whose `.params` are the policy's): resume,
  steps (`step_fn`, as `step`: metrics, samples, evaluation (`evaluate_fn`,
  as `evaluate_sets`), checkpoints), the final evaluation; returns the
  final state."""
  config, runtime, sampler = parts.config, parts.runtime, parts.sampler
  asynchronous.check_controllers(config, runtime.process_count)
  session = loop.Session(name, config, runtime, workdir, state, parts.data)
  if session.start:
    sampler.update_weights(session.state.params, version=session.start)
  rollouts = asynchronous.Rollouts(
      functools.partial(rollout_stages, parts), parts.data, session.start,
      config.steps, config.rl.max_staleness,
      threaded=runtime.process_count == 1)

  @functools.cache  # the last step may be an eval_every step too
  def evaluate_now(done: int) -> dict[str, float]:
    return session.evaluated(done, lambda: evaluate_fn(parts, heldout))

  try:
    if config.eval_examples and session.start == 0:
      evaluate_now(0)
    data_state = None  # where the next rollout begins (None: not moved)
    with console.Progress(config.steps - session.start, name,
                          enabled=runtime.is_coordinator) as bar, (
                              session.goodput.training()):
      announced = False
      for index in range(session.start, config.steps):
        done, began = index + 1, time.perf_counter()
        session.profiler.before(done)
        ready = rollouts.get(index)
        # A stop inside a step keeps the state before it with the data where
        # the step began: the resumed run redoes the step as it would have.
        stop = functools.partial(session.save_and_wait, index,
                                 ready.data_before)
        session.state, values = step_fn(
            parts, session.state, index, ready.result,
            phases.Timer(rollout=ready.seconds), preemption, stop)
        rollouts.published(done)
        data_state = ready.data_after
        values.update(ready.metrics(index),
                      **{'time/step': time.perf_counter() - began})
        announced = announced or announce_sync(name, parts)
        report(parts, session.writer, done, values, ready.result)
        bar.update(loss=values['loss'], reward=values['reward_mean'])
        if config.eval_every and done % config.eval_every == 0:
          evaluate_now(done)
        session.end_of_step(done, preemption, data_state)
  finally:
    rollouts.close()

  session.save(config.steps, data_state)
  result = evaluate_now(config.steps) if config.eval_examples else {}
  session.close()
  if runtime.is_coordinator and result:
    print(evaluate.summary(name, result))
  return session.state


def announce_sync(name: str, parts: Parts) -> bool:
  """Says how the first weight sync went (PPO's critic warm-up has none);
  whether there was one to announce."""
  synced = parts.sampler.last_sync
  if synced and parts.runtime.is_coordinator:
    console.say(f'{name}: weight sync by {synced.path}, '
                f'{synced.bytes / 2**20:.1f} MiB in {synced.groups} groups')
  return bool(synced)


def report(parts: Parts, writer: Any, done: int, values: dict[str, float],
           result: phases.Rollout) -> None:
  """A finished step's metrics (after the non-finite check) and samples."""
  config = parts.config
  loop.check_finite(values, config.optimizer.max_nonfinite_steps, done)
  if done % config.log_every == 0 or done == config.steps:
    writer.write(done, values)
  if config.sample_every and done % config.sample_every == 0:
    writer.samples(done, phases.samples(result, parts.tokenizer,
                                        config.samples_per_log))


def samples_and_evaluation(config: Any, rollout_model: Any,
                           rollout_mesh: Any) -> list[plans.Phase]:
  """What the rollout engine generates: a step's samples and the held-out
  evaluation's."""
  return [plan_lib.rollout_phase(config, rollout_model, rollout_mesh),
          *plan_lib.evaluation_phases(config, rollout_model, rollout_mesh)]


def compile_plan(config: Any, meshes: meshes_lib.RoleMeshes,
                 generation: Callable[..., list[plans.Phase]] = (
                     samples_and_evaluation)) -> plans.Plan:
  """This job's programs, from shapes, for compile-only checks: what
  `plan` builds for a run (the train step, the logps passes), the rollout
  engine's programs (`generation(config, rollout_model, rollout_mesh)`),
  the reward model's and judge's, and the weight sync's relayouts, with
  the state each role keeps resident."""
  rl, rules = config.rl, config.sharding
  programs = plan_lib.plan(config, meshes, abstract=True)
  policy, rollout_mesh = programs.policy, meshes['rollout']
  full_state = nnx.state(policy.model())
  rollout_model = nnx.merge(policy.full_graphdef, plans.with_shardings(
      full_state, programs.rollout_shardings))

  def lower_logps(mesh, params_state):
    return programs.logps(mesh).lower(params_state, plan_lib.batch_shapes(
        config, rl.logps_micro_batch_size, mesh, phases.SEQUENCES))

  resident = {'actor': program.resident(policy),
              'rollout': {'rollout copy': plans.per_device(
                  nnx.state(rollout_model))}}
  plan_phases = [
      program.train_phase(policy, plan_lib.batch_shapes(
          config, rl.mini_batch_size, policy.mesh,
          token_names=programs.needed + (
              ('advantages',) if functions.token_advantage(rl.advantage)
              or rl.tree.chains else ()))),
      *generation(config, rollout_model, rollout_mesh),
      *plan_lib.scorer_phases(config, meshes, resident)]
  out = plans.Plan(resident, plan_phases, [plans.Transfer(
      'weight sync', policy.params,
      plans.on_mesh(policy.params, rollout_mesh, rules),
      programs.sync, held=True)])
  if 'old_logps' in programs.needed:
    plan_phases.append(plans.logps_phase(
        'old logps', meshes, policy.mesh, full_state, rules, lower_logps))
  if plan_lib.from_teacher(rl):
    plan_phases.append(plan_lib.teacher_phase(config, meshes, resident))
  elif 'ref_logps' in programs.needed:
    plans.reference_phase(config, meshes, full_state, lower_logps, out)
  out.transfers.append(plan_lib.to_actor_transfer(config, meshes, programs))
  calls = dict.fromkeys(('old logps', 'reference logps', 'teacher logps'),
                        plan_lib.logps_calls(config))
  calls['train step'] = plan_lib.total_updates(config) / config.steps
  out.phases = [dataclasses.replace(p, per_step=calls.get(p.name, p.per_step))
                for p in out.phases]
  out.tokens_per_step = rl.prompts_per_step * rl.num_generations * (
      rl.max_prompt_length + rl.max_new_tokens)
  return out
