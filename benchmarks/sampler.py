"""Sampler throughput against Tunix's vanilla sampler, level: same weights,
same workload, both sides ending with their tokens on the host.

Two Gemma-architecture workloads, float32, one device, random prompts,
exactly `new` tokens (EOS ignored), temperature 1.0, top_p 0.95:
  small: vocab 256, 4 layers, embed 256, 4 heads / 1 KV head, head_dim 64,
         MLP 1024; 16 prompts of 32 tokens, 64 new;
  large: vocab 32,000, 8 layers, embed 512, 8 heads / 1 KV head, head_dim
         64, MLP 2048; 16 prompts of 64 tokens, 128 new (matmuls dominate).
First both engines decode greedily from the same weights and their tokens
must be equal. Then one warm-up call each (its time, compilation included,
is reported) and the median of 5 rounds, the two samplers' calls
interleaved. Our call fetches its tokens and log-probabilities to the host;
Tunix's returns host token lists (it also detokenises, here a join of
ids). Needs google-tunix (the test extra, or
benchmarks/requirements-peer.txt); without it only ours runs.

  python benchmarks/sampler.py [--workloads=small,large]

Target (issue 23): at least 1.6x Tunix's new tokens/s on both (goal 2x).
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
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from tunix_pw.models import checkpoints, presets  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.sampling.rollout import SamplingConfig  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.sampling.sampler import Sampler  # pylint: disable=g-import-not-at-top,wrong-import-position

WORKLOADS = {  # (model, batch, prompt, new)
    'small': (dict(vocab_size=256, num_layers=4, embed_dim=256, num_heads=4,
                   mlp_dim=1024), 16, 32, 64),
    'large': (dict(vocab_size=32000, num_layers=8, embed_dim=512,
                   num_heads=8, mlp_dim=2048), 16, 64, 128),
}
REPEATS = 5


def peak_rss_mb() -> float:
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith('VmHWM'):
        return int(line.split()[1]) / 1024
  return 0.0


def first_and_rates(tokens: int, *calls):
  """Each call's first (warm-up, compiling) time, then the median rate
  (`tokens` per call) of REPEATS rounds that interleave the calls."""
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
  return firsts, [tokens / statistics.median(t) for t in times]


def ours(model, prompts, new: int, greedy: bool = False):
  """A call that generates and returns the tokens on the host."""
  sampler = Sampler(model, pad_id=0, eos_ids=(1,))
  config = SamplingConfig(max_new_tokens=new, temperature=0.0 if greedy
                          else 1.0, top_p=1.0 if greedy else 0.95,
                          ignore_eos=True)

  def call():
    out = sampler.generate(prompts, config)
    tokens, _ = jax.device_get((out.tokens, out.logprobs))
    assert tokens.shape[1] >= new
    return tokens[:, :new]

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


def tunix_model(model, cfg):
  """Tunix's Gemma holding our model's weights, in Tunix's layout."""
  from tunix.models.gemma import model as tunix_gemma  # pylint: disable=g-import-not-at-top
  config = tunix_gemma.ModelConfig(
      num_layers=cfg.num_layers, num_embed=cfg.vocab_size,
      embed_dim=cfg.embed_dim, hidden_dim=cfg.mlp_dim,
      num_heads=cfg.num_heads, head_dim=cfg.head_dim,
      num_kv_heads=cfg.num_kv_heads, final_logit_softcap=None,
      use_post_attn_norm=False, use_post_ffw_norm=False,
      attention_types=(tunix_gemma.AttentionType.GLOBAL,) * cfg.num_layers)
  peer = tunix_gemma.Gemma(config, rngs=nnx.Rngs(0))
  group = model.groups[0][0]
  for i, layer in enumerate(peer.layers):
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
  return peer


def tunix_peer(model, cfg, prompts, new: int, greedy: bool = False):
  """Tunix's sampler on our weights, in Tunix's layout."""
  from tunix.generate import sampler as tunix_sampler  # pylint: disable=g-import-not-at-top
  peer = tunix_model(model, cfg)
  sampler = tunix_sampler.Sampler(
      peer, _IdsTokenizer(), tunix_sampler.CacheConfig(
          cache_size=len(prompts[0]) + new, num_layers=cfg.num_layers,
          num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim))
  strings = [' '.join(map(str, p)) for p in prompts]
  sampling = {} if greedy else dict(temperature=1.0, top_p=0.95)

  def call():
    out = sampler(strings, max_generation_steps=new, eos_tokens=[-1], seed=0,
                  **sampling)
    assert min(len(t) for t in out.tokens) == new
    return np.array([t[:new] for t in out.tokens])

  return call


def model_config(name: str):
  """A workload's Gemma-architecture model."""
  return presets.PRESETS['gemma-2b'].replace(num_kv_heads=1, head_dim=64,
                                              **WORKLOADS[name][0])


def workload(name: str) -> dict:
  _, batch, prompt, new = WORKLOADS[name]
  cfg = model_config(name)
  model = checkpoints.init(cfg, seed=0)
  prompts = np.random.default_rng(0).integers(
      2, cfg.vocab_size, (batch, prompt)).tolist()
  calls = [ours(model, prompts, new)]
  start = time.perf_counter()
  calls[0]()
  first = time.perf_counter() - start
  result = dict(workload=name, peak_rss_mb=round(peak_rss_mb(), 1))
  try:
    import tunix  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    result['tunix'] = 'not installed (benchmarks/requirements-peer.txt)'
  else:
    ours_greedy = ours(model, prompts, new, greedy=True)()
    peer_greedy = tunix_peer(model, cfg, prompts, new, greedy=True)()
    result['greedy_tokens_equal'] = bool((ours_greedy == peer_greedy).all())
    calls.append(tunix_peer(model, cfg, prompts, new))
  firsts, rates = first_and_rates(batch * new, *calls)
  firsts[0] = first  # first_and_rates found ours compiled already
  result.update(new_tokens_per_s=round(rates[0], 1),
                first_call_s=round(firsts[0], 2))
  if len(calls) > 1:
    result.update(tunix_new_tokens_per_s=round(rates[1], 1),
                  tunix_first_call_s=round(firsts[1], 2),
                  speedup_vs_tunix=round(rates[0] / rates[1], 2))
  return result


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--workloads', default='small,large')
  args = parser.parse_args()
  print(json.dumps(dict(
      benchmark='sampler',
      workloads=[workload(name) for name in args.workloads.split(',')],
      target_speedup=1.6)))


if __name__ == '__main__':
  main()
