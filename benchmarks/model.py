"""Decoder speed on this machine: forward tokens/s and train-step MFU.

Pinned workload: Gemma-style, d_model 768, 12 layers, 12 heads / 1 KV head,
head_dim 64, MLP 3072, vocab 16384, batch 4 x 512 tokens, float32, no remat,
one device. MFU counts FLOPs = 6 x params x tokens + causal attention
(6 x layers x batch x T^2 x heads x head_dim) against the float32 matmul
peak (a 2048^3 jnp.dot). The peak and the train step are timed in the same
rounds, one after the other, and both take the fastest round (the free
cores change by the second here: a median of peak runs taken apart from
the step is not a denominator, and once gave an MFU above 1).

  python benchmarks/model.py [--rounds=7]

Target: train-step MFU >= 60% of the peak.
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# Under the allocator jobs run under (both sides, where a peer runs too).
from tunix_pw.runtime import allocator  # pylint: disable=g-import-not-at-top,wrong-import-position
allocator.use_tcmalloc()

from flax import nnx  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import optax  # pylint: disable=g-import-not-at-top,wrong-import-position

from tunix_pw.models import checkpoints, presets  # pylint: disable=g-import-not-at-top,wrong-import-position

CFG = presets.PRESETS['gemma-2b'].replace(
    vocab_size=16384, embed_dim=768, num_layers=12, num_heads=12,
    num_kv_heads=1, head_dim=64, mlp_dim=3072)
BATCH, SEQ = 4, 512


def interleaved_seconds(fns: dict, rounds: int) -> dict[str, list[float]]:
  """Each function timed once per round, in turn, after a warm-up."""
  for fn in fns.values():
    jax.block_until_ready(fn())  # compile / warm up
  times = {name: [] for name in fns}
  for _ in range(rounds):
    for name, fn in fns.items():
      start = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - start)
  return times


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--rounds', type=int, default=7)
  args = parser.parse_args()

  a = jnp.ones((2048, 2048), jnp.float32)
  dot = jax.jit(jnp.dot)

  model = checkpoints.init(CFG, seed=0)
  graphdef, params = nnx.split(model)
  n_params = sum(x.size for x in jax.tree.leaves(params))
  tokens = jax.random.randint(jax.random.key(0), (BATCH, SEQ), 0,
                              CFG.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(SEQ), (BATCH, SEQ))
  segments = jnp.ones_like(tokens)

  def loss_fn(params):
    logits, _ = nnx.merge(graphdef, params)(tokens, positions, segments)
    logp = jax.nn.log_softmax(logits[:, :-1])
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], -1).mean()

  forward = jax.jit(lambda p: nnx.merge(graphdef, p)(tokens, positions,
                                                     segments)[0])
  optimizer = optax.adamw(1e-4)

  @jax.jit
  def train_step(params, opt_state):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  state = [params, optimizer.init(params)]

  def step():
    state[0], state[1], loss = train_step(*state)
    return loss

  times = interleaved_seconds(dict(peak=lambda: dot(a, a), train=step,
                                    forward=lambda: forward(params)),
                               args.rounds)
  peak = 2 * 2048**3 / min(times['peak'])
  forward_s, train_s = min(times['forward']), min(times['train'])
  tokens_per_step = BATCH * SEQ
  # Forward QK^T and PV: 4 * B * N * T^2 * H per layer, halved for
  # causality, times 3 for forward + backward.
  attention = 6 * CFG.num_layers * BATCH * SEQ**2 * CFG.num_heads * CFG.head_dim
  flops = 6 * n_params * tokens_per_step + attention
  mfu = flops / train_s / peak
  print(json.dumps(dict(
      benchmark='model', params=n_params, tokens_per_step=tokens_per_step,
      matmul_peak_gflops=round(peak / 1e9, 1),
      forward_tokens_per_s=round(tokens_per_step / forward_s, 1),
      train_step_s=round(train_s, 3),
      train_tokens_per_s=round(tokens_per_step / train_s, 1),
      train_gflops=round(flops / train_s / 1e9, 1),
      train_step_s_median=round(statistics.median(times['train']), 3),
      peak_gflops_median=round(
          2 * 2048**3 / statistics.median(times['peak']) / 1e9, 1),
      mfu=round(mfu, 3), target_mfu=0.6)))


if __name__ == '__main__':
  main()
