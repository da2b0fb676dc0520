"""Google Tunix's own GRPO trainer, for benchmarks/grpo_step.py.

Tunix's `GRPOLearner` over an `RLCluster` (vanilla rollout engine) on 8
virtual CPU devices: actor and reference fsdp=4 on devices 0-3, rollout tp=4
on devices 4-7 (disjoint meshes, weights resharded every step); our model's
initial weights in Tunix's Gemma (benchmarks/sampler.py); one update per
step on all of its samples.

Times come from Tunix's own perf tracer (tunix/perf, v1): the
`PerfMetricsExport.from_cluster_config` export that `RLLearner.train` calls
after every global step (`perf/global_step_time`, `perf/sum/rollout_time`,
`perf/sum/refer_inference_time`, `perf/sum/actor_train_time`,
`perf/weight_sync_time`), collected through
`RLCluster.with_external_metrics_logger`. Cross-check: host wall times of
the cluster's generate / get_ref_per_token_logps (waited on) / update_actor
/ sync_weights calls, wrapped on the instance (`wrapped_phases_s`).

One change to Tunix: `RLCluster.sync_weights` is replaced by the same calls
(rollout.update_params with the actor's nnx.Param state, the anchor copy
to pinned_host, global_steps += 1) without the host<->device transfer
guards it sets when the backend is neither TPU nor GPU (on CPU
jax.device_put between the disjoint meshes goes through the host, which
those guards reject), then waiting for the new weights, so that the
weight_sync span holds the transfer. Tunix's `_train_step` compiles in
each of the first two steps.
"""

import statistics
import time

from flax import nnx
import jax
import numpy as np
import psutil

from sampler import tunix_model
from tunix_pw.models import checkpoints

PHASES = {  # our name: Tunix perf metric
    'rollout': 'perf/sum/rollout_time',
    'ref_logps': 'perf/sum/refer_inference_time',
    'train': 'perf/sum/actor_train_time',
    'weight_sync': 'perf/weight_sync_time',
}


class CharTokenizer:
  """Our CharTokenizer's ids in the interface Tunix's TokenizerAdapter
  takes (encode, decode, bos_id, eos_id, pad_id): ASCII characters as ids
  4..127; 0 pad, 1 bos, 2 eos, 3 unknown. Tunix's sampler prepends BOS."""

  def encode(self, text, **_):
    return [ord(c) if 4 <= ord(c) < 128 else 3 for c in text]

  def decode(self, ids, **_):
    return ''.join(chr(i) for i in ids if i >= 4)

  def bos_id(self):
    return 1

  def eos_id(self):
    return 2

  def pad_id(self):
    return 0


def on_mesh(peer, mesh):
  """Tunix's model sharded by its own partition specs on `mesh`."""
  state = nnx.state(peer)
  shardings = jax.tree.map(
      lambda spec: jax.sharding.NamedSharding(
          mesh, spec if spec is not None else jax.sharding.PartitionSpec()),
      nnx.get_partition_spec(state))
  nnx.update(peer, jax.device_put(state, shardings))
  return peer


def run_tunix_grpo(cfg, texts: list[str], prompt: int, new: int,
                   prompts_per_step: int, generations: int, steps: int,
                   warmup: int, beta: float, top_p: float,
                   learning_rate: float, temperature: float = 1.0) -> dict:
  """`steps` GRPO steps of Tunix's trainer on `texts` (prompts of `prompt`
  tokens with BOS) from our `cfg` model's initial weights: the median step
  past `warmup` (perf/global_step_time) and its phases, as
  benchmarks/grpo_step.py reports ours, and the details."""
  PROMPT, NEW, PROMPTS, GENERATIONS, WARMUP = (  # pylint: disable=invalid-name
      prompt, new, prompts_per_step, generations, warmup)
  import optax  # pylint: disable=g-import-not-at-top
  from tunix.perf import export as perf_export  # pylint: disable=g-import-not-at-top
  from tunix.perf import metrics as perf_metrics  # pylint: disable=g-import-not-at-top
  from tunix.rl import rl_cluster as rl_cluster_lib  # pylint: disable=g-import-not-at-top
  from tunix.rl.grpo import grpo_learner  # pylint: disable=g-import-not-at-top
  from tunix.rl import utils as rl_utils  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top
  from tunix.sft import utils as sft_utils  # pylint: disable=g-import-not-at-top

  devices = np.array(jax.devices())
  assert len(devices) == 8, devices
  axes = ('fsdp', 'tp')
  actor_mesh = jax.sharding.Mesh(devices[:4].reshape(4, 1), axes)
  rollout_mesh = jax.sharding.Mesh(devices[4:].reshape(1, 4), axes)

  ours = checkpoints.init(cfg, seed=0)  # the weights our job starts from
  actor = on_mesh(tunix_model(ours, cfg), actor_mesh)
  reference = on_mesh(tunix_model(ours, cfg), actor_mesh) if beta else None
  del ours

  samples = PROMPTS * GENERATIONS
  # Tunix counts these batch sizes in prompts (each x num_generations): one
  # mini batch of 4 prompts = the step's 16 samples, one update per step.
  training = rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optax.adamw(learning_rate),
      eval_every_n_steps=10**9, max_steps=steps,
      mini_batch_size=PROMPTS, train_micro_batch_size=PROMPTS,
      rollout_micro_batch_size=PROMPTS,
      compute_logps_micro_batch_size=PROMPTS)
  rollout = base_rollout.RolloutConfig(
      max_tokens_to_generate=NEW, max_prompt_length=PROMPT,
      kv_cache_size=PROMPT + NEW, temperature=temperature, top_p=top_p,
      top_k=None, seed=None)
  cluster_config = rl_cluster_lib.ClusterConfig(
      role_to_mesh={rl_cluster_lib.Role.ACTOR: actor_mesh,
                    rl_cluster_lib.Role.REFERENCE: actor_mesh,
                    rl_cluster_lib.Role.ROLLOUT: rollout_mesh},
      rollout_engine='vanilla', offload_to_cpu=False,
      training_config=training, rollout_config=rollout)
  perf = perf_metrics.PerfMetricsConfig(
      custom_export_fn=perf_export.PerfMetricsExport.from_cluster_config(
          cluster_config))
  cluster = rl_cluster_lib.RLCluster(
      actor=actor, reference=reference, tokenizer=CharTokenizer(),
      cluster_config=cluster_config, perf_config=perf)

  logged = {}  # global step -> {metric: value}

  def collect(buffer):
    row = logged.setdefault(buffer.global_steps, {})
    for name, (values, op) in buffer.metrics.items():
      if name.startswith('perf/') or name in (
          'completions/mean_length', 'rewards/score/mean'):
        value = np.asarray(values, dtype=np.float64)
        row[name] = float(op(value) if op is not None else value.mean())

  cluster.with_external_metrics_logger(collect)
  synced_at = []  # wall clock at the end of each step (its weight sync)

  def sync_weights():
    """RLCluster.sync_weights without its CPU-only transfer guards, then
    waiting for the new weights. On CPU the guards (host<->device
    'disallow_explicit', set when the backend is neither TPU nor GPU)
    reject Tunix's own reshard between disjoint meshes: jax.device_put
    from devices 0-3 to 4-7 takes its host slow path there."""
    model = cluster.actor_trainer.model
    filter_types = (nnx.LoRAParam if sft_utils.is_lora_enabled(model)
                    else nnx.Param,)
    cluster.rollout.update_params(nnx.state(model, filter_types),
                                  filter_types)
    cluster._anchor_policy_state = rl_utils.put_params_on_memory_kind(  # pylint: disable=protected-access
        nnx.state(model), 'pinned_host')
    jax.block_until_ready((nnx.state(cluster.rollout.model()),
                           cluster._anchor_policy_state))  # pylint: disable=protected-access
    cluster.global_steps += 1
    synced_at.append(time.time())

  cluster.sync_weights = sync_weights

  # Cross-check: host wall time of each phase's call on the cluster,
  # waiting for its result (the reference log-probabilities are otherwise
  # consumed asynchronously by the update).
  wrapped = {}  # phase -> seconds per call

  def timed(phase, fn, wait=False):
    def call(*args, **kwargs):
      start = time.perf_counter()
      out = fn(*args, **kwargs)
      if wait:
        jax.block_until_ready(out)
      wrapped.setdefault(phase, []).append(time.perf_counter() - start)
      return out
    return call

  cluster.generate = timed('rollout', cluster.generate)
  cluster.get_ref_per_token_logps = timed(
      'ref_logps', cluster.get_ref_per_token_logps, wait=True)
  cluster.update_actor = timed('train', cluster.update_actor)
  cluster.sync_weights = timed('weight_sync', cluster.sync_weights)

  learner = grpo_learner.GRPOLearner(
      rl_cluster=cluster,
      algo_config=grpo_learner.GRPOConfig(
          num_generations=GENERATIONS, num_iterations=1, beta=beta,
          epsilon=0.2, kl_loss_mode='low_var_kl',  # k3, as ours
          loss_agg_mode='sequence-mean-token-mean'),
      reward_fns=lambda prompts, completions, **_: [
          float(len(c)) / NEW for c in completions])
  assert learner.should_sync_weights and learner.can_enable_async_rollout
  assert len(texts) >= (steps + 1) * PROMPTS
  dataset = [{'prompts': np.array(texts[i * PROMPTS:(i + 1) * PROMPTS])}
             for i in range(steps + 1)]
  start = time.perf_counter()
  learner.train(dataset)
  total = time.perf_counter() - start

  # A step's perf export lands in the next global step's buffer (it is
  # taken after sync_weights has counted the step); its rollout's metrics
  # in its own.
  perf_steps = sorted(k for k, row in logged.items()
                      if 'perf/global_step_time' in row)
  rows = [logged[k] for k in perf_steps]
  rollouts = [logged.get(k - 1, {}) for k in perf_steps]
  assert len(rows) == steps, (len(rows), sorted(logged))
  step_s = [row['perf/global_step_time'] for row in rows]
  phases_s = {k: [row.get(m, 0.0) for row in rows] for k, m in PHASES.items()}
  phases_s['other'] = [s - sum(p[i] for p in phases_s.values())
                       for i, s in enumerate(step_s)]
  kept = slice(WARMUP if steps > WARMUP else 0, None)
  median = lambda xs: statistics.median(xs[kept])
  step = median(step_s)
  return dict(
      benchmark='tunix_grpo', steps=steps,
      step_s=round(step, 4),
      phases_s={k: round(median(v), 4) for k, v in phases_s.items()},
      weight_sync_fraction=round(median(phases_s['weight_sync']) / step, 4),
      rollout_tokens_per_s=round(
          samples * NEW / median(phases_s['rollout']), 1),
      per_step_s=[round(s, 4) for s in step_s],
      per_step_phases_s={k: [round(x, 4) for x in v]
                         for k, v in phases_s.items()},
      completion_mean_length=[
          round(row.get('completions/mean_length', float('nan')), 2)
          for row in rollouts],
      wrapped_phases_s={k: [round(x, 4) for x in v]
                        for k, v in wrapped.items()},
      train_call_s=round(total, 2),
      first_step_s=round(synced_at[0] - psutil.Process().create_time(), 2),
      median_over=f'steps {kept.start + 1}..{steps}',
      timing='tunix.perf v1 tracer (PerfMetricsExport.from_cluster_config); '
             'sync_weights without CPU transfer guards, waited on',
      config=dict(beta=beta, top_p=top_p, temperature=temperature,
                  learning_rate=learning_rate, prompts=PROMPTS,
                  generations=GENERATIONS, prompt_tokens=PROMPT,
                  new_tokens=NEW, actor_mesh='fsdp=4 on devices 0-3',
                  rollout_mesh='tp=4 on devices 4-7'))
