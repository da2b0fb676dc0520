"""SFT's trainer, for the jobs that train on sequences (sft, its agent
warm-up, distill): the policy and its train step, the data pipeline, one
explicit loop, and the plan of its programs.

data -> (packed or bucketed) batches on the actor mesh -> train step
(gradient accumulation, loss on completion tokens; a teacher's outputs
beside them) -> metrics -> periodic held-out evaluation -> checkpoint ->
preemption check.
"""

from __future__ import annotations

from collections.abc import Callable
import functools
from typing import Any

from tunix_pw import checks, console
from tunix_pw.data import formats, pipeline
from tunix_pw.errors import UsageError
from tunix_pw.models import blocks, checkpoints
from tunix_pw.runtime import backend, meshes as meshes_lib, reshard
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.runtime.sharding import Sharder
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.sampling.sampler import make_sampler
from tunix_pw.train import evaluate, loop, optim, plans, program, setup
from tunix_pw.train import step as step_lib


def check(config: Any) -> None:
  """The SFT settings an SFT-style job (sft, distill) checks."""
  checks.at_least_one(config, '--config', 'steps', 'batch_size',
                      'micro_batches', 'log_every', 'eval_batch_size',
                      'eval_max_new_tokens')
  checks.not_negative(config, '--config', 'logits_chunk')
  checkpoints.check_model_block(config.model)
  pipeline.check_data_block(config.data)
  optim.check(config.optimizer)
  setup.check_lora_block(config.lora)
  if config.data.name in ('preferences', 'unpaired'):
    raise UsageError(f'--config.data.name={config.data.name!r} is for '
                     'DPO/ORPO/KTO (configs/dpo.py); SFT reads arithmetic, '
                     'gsm8k or chat.')
  if config.steps < 1:
    raise UsageError(f'--config.steps={config.steps} must be at least 1.')
  if config.data.packing and config.data.name in formats.PICTURED:
    raise UsageError('--config.data.packing packs no images yet: train '
                     f'{config.data.name} unpacked.')
  if config.stop_at_accuracy and not (
      0 < config.stop_at_accuracy <= 1 and config.eval_every and
      config.eval_examples):
    raise UsageError(f'--config.stop_at_accuracy={config.stop_at_accuracy} '
                     'must be in (0, 1] and needs --config.eval_every and '
                     '--config.eval_examples.')
  if config.batch_size % config.micro_batches:
    raise UsageError(f'--config.batch_size={config.batch_size} does not '
                     f'split into --config.micro_batches='
                     f'{config.micro_batches}.')
  meshes_lib.check_batch(config.batch_size // config.micro_batches,
                         config.meshes, 'actor', config.sharding.batch,
                         '--config.batch_size / --config.micro_batches')


def sft_loss(model, batch, rng, shard: Sharder = Sharder(), chunk: int = 0):
  """`shard` constrains activations to the mesh (batch over the data
  axes), so XLA never replicates them where the weights are sharded;
  `chunk`: `--config.logits_chunk`."""
  del rng
  nll, weight, correct = step_lib.model_token_nll(
      model, batch['tokens'], batch['positions'], batch['segment_ids'],
      batch['loss_mask'], shard, chunk, images=batch.get('images'))
  return (nll * weight).sum(), dict(weight=weight.sum(),
                                    accuracy=(correct * weight).sum())


def plan(config: Any, meshes: meshes_lib.RoleMeshes, *, abstract: bool,
         loss: Any = None) -> program.Program:
  """The policy and its train step (from shapes when `abstract`);
  `loss(model, batch, rng, shard=)`: distillation's, or (None) SFT's."""
  mesh = meshes['actor']
  loss = loss or functools.partial(sft_loss, chunk=config.logits_chunk)
  return program.build(
      config, mesh, functools.partial(
          loss, shard=Sharder(mesh, config.sharding)),
      micro_batches=config.micro_batches, total_updates=config.steps,
      abstract=abstract)


def evaluation_plan(config: Any, policy: program.Program, out: plans.Plan,
                    batch: int = 0, prompts: int = 0) -> plans.Plan:
  """`out` with the held-out evaluation's programs (greedy generation on
  the actor, `batch` prompts (eval_batch_size) of up to `prompts` tokens
  (max_length)) and the policy's move into its sampler."""
  if not config.eval_examples:
    return out
  batch, prompts = (batch or config.eval_batch_size,
                    prompts or config.data.max_length)
  out.phases.append(plans.generation_phase(
      'evaluation', 'actor', policy.model(), policy.mesh, config.sharding,
      batch, prompts, SamplingConfig(config.eval_max_new_tokens,
                                     greedy=True), per_step=0))
  out.transfers.append(plans.Transfer(
      'evaluation weights', policy.params, policy.params,
      reshard.Budget.from_block(config.runtime), ('actor', 'actor'),
      per_step=0))
  return out


def batches(config: Any, source: Any, tokenizer: Any, runtime: Any,
            seed: int, transform: Any = None,
            processing: Any = None) -> pipeline.Pipeline:
  """The training pipeline: completion-masked sequences (each example's
  through `transform`, by default the dataset's format, with its images
  through `processing`), packed into rows of max_length or padded to
  length buckets (max_length when several processes must agree on one
  shape)."""
  length = config.data.max_length
  fixed = config.data.packing or runtime.process_count > 1
  pad = lambda rows: pipeline.pad_batch(
      rows, length if fixed else min(length, pipeline.bucket(
          max(len(r['tokens']) for r in rows))), tokenizer.pad_id)
  transform = transform or formats.sft_transform(
      config.data.name, tokenizer, length, config.data.overlong,
      config.data.chat, processing)
  return pipeline.Pipeline(
      source, transform,
      batch_size=config.batch_size, seed=seed, num_epochs=None,
      process_index=runtime.process_index,
      process_count=runtime.process_count, batch_fn=pad,
      pack_length=length if config.data.packing else 0,
      what=f'the train split of {config.data.name}',
      dropping=pipeline.overlong_filter(config.data))


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption, *, name: str = 'sft',
        policy: program.Program | None = None, targets: Any = None,
        evaluation: Callable, transform: Any = None) -> None:
  """SFT's loop. `evaluation(test split, sampler, tokenizer, mesh)` ->
  (() -> eval/ scalars, threads to shut down or None), e.g. `exact_match`;
  `targets(host batch) -> arrays on the actor mesh` adds a teacher's
  outputs to each batch (distillation, with its `policy`);
  `transform(tokenizer)` makes an example a sequence (`batches`)."""
  mesh, rules = meshes['actor'], config.sharding
  policy = policy or plan(config, meshes, abstract=False)
  tokenizer = blocks.tokenizer(config.model)
  spec = pipeline.DataSpec.from_block(config.data)
  sources, _ = pipeline.prepare(spec, runtime)
  processing = setup.image_processing(config.data, config.model)
  data = batches(config, sources['train'], tokenizer, runtime, config.seed,
                 transform and transform(tokenizer), processing)
  sampler = make_sampler(policy.model(), tokenizer, mesh=mesh, rules=rules,
                         runtime=runtime,
                         sync_budget=reshard.Budget.from_block(
                             config.runtime))
  session = loop.Session(name, config, runtime, workdir, policy.state, data)
  evaluation, tools = evaluation(sources['test'], sampler, tokenizer, mesh,
                                 processing)

  @functools.cache  # the last step may be an eval_every step too
  def evaluate_now(step: int) -> dict[str, float]:
    sampler.update_weights(session.state.params)
    return session.evaluated(step, evaluation)

  def step(index: int) -> tuple[Any, int]:
    del index
    host = session.batch()
    batch = pipeline.place(host, mesh, rules)
    if targets:
      batch.update(targets(host))
    session.state, step_metrics = policy.train_step(session.state, batch)
    return step_metrics, int((host['segment_ids'] > 0).sum())

  def stop_after(done: int) -> bool:
    return bool(config.eval_every and done % config.eval_every == 0 and
                reached(config, evaluate_now(done), runtime))

  if session.start and config.stop_at_accuracy and stop_after(session.start):
    last = session.start  # it stopped there: the same run again ends there
  else:
    last = loop.run_steps(session, preemption, step, ('loss', 'accuracy'),
                          stop_after)
  session.save(last)
  result = evaluate_now(last) if config.eval_examples else {}
  session.close()
  if tools:
    tools.shutdown(wait=False, cancel_futures=True)
  if config.export:
    setup.export(config, policy.model(session.state.params))
  if runtime.is_coordinator and result:
    print(evaluate.summary(name, result))


def exact_match(config: Any, verifier: Callable, source: Any, sampler: Any,
                tokenizer: Any, mesh: Any,
                processing: Any = None) -> tuple[Callable, None]:
  """Greedy accuracy on the held-out split, each completion judged by
  `verifier` (the job's `eval_verifier`)."""
  del mesh
  prompts, answers, pixels = setup.heldout(
      config.data.name, source, tokenizer, config.eval_examples,
      config.data.chat, processing)
  return (lambda: {f'eval/{k}': v for k, v in evaluate.exact_match(
      sampler, tokenizer, prompts, answers, config.eval_max_new_tokens,
      config.eval_batch_size, verifier, pixels).items()}), None



def reached(config: Any, result: dict[str, float], runtime: Any) -> bool:
  """Whether an evaluation reached --config.stop_at_accuracy (said once)."""
  target = config.stop_at_accuracy
  if not target or result['eval/accuracy'] < target:
    return False
  if runtime.is_coordinator:
    console.say(f'sft: held-out accuracy {result["eval/accuracy"]:.1%} '
                f'reached --config.stop_at_accuracy={target:g}: stopping')
  return True
