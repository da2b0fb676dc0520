"""Tree rollouts against independent chains: rollout seconds per leaf and
tokens decoded per leaf, same sampler, same rows.

The sampler benchmark's small workload (benchmarks/sampler.py), 8 prompts
of 32 tokens, 8 rows (leaves) each, 64 new tokens (EOS ignored),
temperature 1: `generate` with 8 generations per prompt against
`generate_tree` with 2 chains from the prompt, a branch point every 16
tokens, the most surprising live chain forking 3 times. One warm-up call
each, then the median of 5 rounds, the two calls interleaved; each call
ends with its tokens on the host. Prints one JSON line.

  python benchmarks/tree.py

Target (issue 56): rollout seconds per leaf at least 1.3x lower for the
tree.
"""

import json
import os
import statistics
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

from tunix_pw.runtime import allocator  # pylint: disable=g-import-not-at-top,wrong-import-position
allocator.use_tcmalloc()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import sampler as sampler_bench  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.models import checkpoints  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.sampling import tree  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.sampling.rollout import SamplingConfig  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.sampling.sampler import Sampler  # pylint: disable=g-import-not-at-top,wrong-import-position

PROMPTS, LENGTH, ROWS, NEW = 8, 32, 8, 64
SHAPE = tree.TreeShape(chains=2, segment=16, branches=1, forks=3)


def main() -> None:
  cfg = sampler_bench.model_config('small')
  sampler = Sampler(checkpoints.init(cfg, seed=0), pad_id=0, eos_ids=())
  prompts = np.random.default_rng(0).integers(
      2, cfg.vocab_size, (PROMPTS, LENGTH)).tolist()
  sampling = SamplingConfig(max_new_tokens=NEW, temperature=1.0,
                            ignore_eos=True, generations=ROWS)
  decoded = {}

  def chains():
    out = sampler.generate(prompts, sampling)
    decoded['chains'] = int(jax.device_get(out.lengths).sum())
    jax.device_get(out.tokens)

  def grown():
    out = sampler.generate_tree(prompts, sampling, SHAPE)
    decoded['tree'] = out.decoded()
    jax.device_get(out.completions.tokens)

  calls = dict(chains=chains, tree=grown)
  for call in calls.values():
    call()  # compiles
  seconds = {name: [] for name in calls}
  for _ in range(5):
    for name, call in calls.items():
      start = time.perf_counter()
      call()
      seconds[name].append(time.perf_counter() - start)
  leaves = PROMPTS * ROWS
  per_leaf = {n: statistics.median(s) / leaves for n, s in seconds.items()}
  print(json.dumps(dict(
      workload='small', prompts=PROMPTS, leaves_per_prompt=ROWS,
      new_tokens=NEW, tree=vars(SHAPE),
      seconds_per_leaf={n: round(v, 5) for n, v in per_leaf.items()},
      decoded_tokens_per_leaf={n: round(v / leaves, 1)
                               for n, v in decoded.items()},
      speedup=round(per_leaf['chains'] / per_leaf['tree'], 2))))


if __name__ == '__main__':
  main()
