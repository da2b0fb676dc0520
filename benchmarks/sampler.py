"""Sampler throughput against Tunix's vanilla sampler, same workload.

Gemma architecture, vocab 256, 4 layers, embed 256, 4 heads / 1 KV head,
head_dim 64, MLP 1024, float32, one device; 16 prompts of 32 random tokens;
exactly 64 new tokens (EOS ignored); temperature 1.0, top_p 0.95. One
warm-up call (its time, compilation included, is reported), then the median
of 5 (the two samplers' calls interleaved, so that drift in this machine's
speed hits both alike). With google-tunix installed (benchmarks/requirements-peer.txt), its
sampler runs the same workload on the same weights in the same process.

  python benchmarks/sampler.py

Target: at least 1.5x Tunix's new tokens/s.
"""

import json
import os
import statistics
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

from flax import nnx  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from tunix_pw.models import checkpoints, presets  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.sampling.rollout import SamplingConfig  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.sampling.sampler import Sampler  # pylint: disable=g-import-not-at-top,wrong-import-position

CFG = presets.PRESETS['gemma-2b'].replace(
    vocab_size=256, num_layers=4, embed_dim=256, num_heads=4, num_kv_heads=1,
    head_dim=64, mlp_dim=1024)
BATCH, PROMPT, NEW, REPEATS = 16, 32, 64, 5


def peak_rss_mb() -> float:
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmHWM'):
        return int(line.split()[1]) / 1024
  return 0.0


def first_and_rates(*calls):
  """Each call's first (warm-up, compiling) time, then the median rate of
  REPEATS rounds that interleave the calls."""
  firsts, times = [], [[] for _ in calls]
  for call in calls:
    start = time.perf_counter()
    call()
    firsts.append(time.perf_counter() - start)
  for _ in range(REPEATS):
    for call, spent in zip(calls, times):
      start = time.perf_counter()
      call()
      spent.append(time.perf_counter() - start)
  return firsts, [BATCH * NEW / statistics.median(t) for t in times]


def ours(model, prompts):
  sampler = Sampler(model, pad_id=0, eos_ids=(1,))
  config = SamplingConfig(max_new_tokens=NEW, temperature=1.0, top_p=0.95,
                          ignore_eos=True)

  def call():
    out = sampler.generate(prompts, config)
    assert int(jax.block_until_ready(out.lengths).min()) == NEW

  return call


class _IdsTokenizer:
  """Prompts travel to Tunix's sampler as space-separated token ids."""

  def encode(self, text, **_):
    return [int(t) for t in text.split()]

  def decode(self, ids, **_):
    return ' '.join(map(str, ids))

  def bos_id(self):
    return 0  # falsy: Tunix then adds no BOS, like ours

  def eos_id(self):
    return 1

  def pad_id(self):
    return 0


def tunix_peer(model, prompts):
  from tunix.generate import sampler as tunix_sampler  # pylint: disable=g-import-not-at-top
  from tunix.models.gemma import model as tunix_gemma  # pylint: disable=g-import-not-at-top
  config = tunix_gemma.ModelConfig(
      num_layers=CFG.num_layers, num_embed=CFG.vocab_size,
      embed_dim=CFG.embed_dim, hidden_dim=CFG.mlp_dim,
      num_heads=CFG.num_heads, head_dim=CFG.head_dim,
      num_kv_heads=CFG.num_kv_heads, final_logit_softcap=None,
      use_post_attn_norm=False, use_post_ffw_norm=False,
      attention_types=(tunix_gemma.AttentionType.GLOBAL,) * CFG.num_layers)
  peer = tunix_gemma.Gemma(config, rngs=nnx.Rngs(0))
  # The same weights: ours, in Tunix's layout.
  for i, layer in enumerate(peer.layers):
    group = model.groups[0][0]
    layer.attn.q_einsum.w.value = group.attn.q[i].transpose(1, 0, 2)
    layer.attn.kv_einsum.w.value = jnp.stack(
        [group.attn.k[i].transpose(1, 0, 2), group.attn.v[i].transpose(1, 0, 2)])
    layer.attn.attn_vec_einsum.w.value = group.attn.o[i]
    layer.mlp.gate_proj.kernel.value = group.mlp.gate[i]
    layer.mlp.up_proj.kernel.value = group.mlp.up[i]
    layer.mlp.down_proj.kernel.value = group.mlp.down[i]
    layer.pre_attention_norm.scale.value = group.pre_attn_norm.scale[i]
    layer.pre_ffw_norm.scale.value = group.pre_mlp_norm.scale[i]
  peer.embedder.input_embedding.value = model.embedding[...]
  peer.final_norm.scale.value = model.final_norm.scale[...]
  sampler = tunix_sampler.Sampler(
      peer, _IdsTokenizer(), tunix_sampler.CacheConfig(
          cache_size=PROMPT + NEW, num_layers=CFG.num_layers,
          num_kv_heads=CFG.num_kv_heads, head_dim=CFG.head_dim))
  strings = [' '.join(map(str, p)) for p in prompts]

  def call():
    out = sampler(strings, max_generation_steps=NEW, temperature=1.0,
                  top_p=0.95, eos_tokens=[-1], seed=0)
    assert min(len(t) for t in out.tokens) == NEW

  return call


def main() -> None:
  model = checkpoints.init(CFG, seed=0)
  prompts = np.random.default_rng(0).integers(
      2, CFG.vocab_size, (BATCH, PROMPT)).tolist()
  calls = [ours(model, prompts)]
  start = time.perf_counter()
  calls[0]()
  first = time.perf_counter() - start
  peak = peak_rss_mb()  # ours compiled and run; the peer not yet built
  try:
    import tunix  # pylint: disable=g-import-not-at-top,unused-import
    calls.append(tunix_peer(model, prompts))
  except ImportError:
    pass
  firsts, rates = first_and_rates(*calls)
  firsts[0] = first  # first_and_rates found ours compiled already
  result = dict(benchmark='sampler', new_tokens_per_s=round(rates[0], 1),
                first_call_s=round(firsts[0], 2), peak_rss_mb=round(peak, 1))
  if len(calls) > 1:
    result.update(tunix_new_tokens_per_s=round(rates[1], 1),
                  tunix_first_call_s=round(firsts[1], 2),
                  speedup_vs_tunix=round(rates[0] / rates[1], 2))
  else:
    result['tunix'] = 'not installed (benchmarks/requirements-peer.txt)'

  result['target_speedup'] = 1.5
  print(json.dumps(result))


if __name__ == '__main__':
  main()
