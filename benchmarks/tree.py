"""Tree rollouts against independent chains: rollout seconds per leaf and
tokens decoded per leaf, same sampler, same rows.

A workload of the sampler benchmark (benchmarks/sampler.py), 8 prompts
of its prompt length, 8 leaves each, its new tokens (EOS ignored),
temperature 1: `generate` with 8 generations per prompt against
`generate_tree` with 1 chain from the prompt, a branch point every 8
tokens where the most surprising live chain forks once (8 leaves by the
7th). The tree's decode batch grows with it (2, 4, then 8 rows per
prompt). One warm-up call each, then the median of 5 rounds, the two
calls interleaved; each call ends with its tokens on the host. Prints one
JSON line per workload.

  python benchmarks/tree.py [--workloads=small,large]

Target (issue 56): rollout seconds per leaf at least 1.3x lower for the
tree.
"""

import argparse
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

PROMPTS, ROWS = 8, 8
SHAPE = tree.TreeShape(chains=1, segment=8, branches=1, forks=1)


def run(workload: str) -> dict:
  cfg = sampler_bench.model_config(workload)
  _, _, length, new = sampler_bench.WORKLOADS[workload]
  sampler = Sampler(checkpoints.init(cfg, seed=0), pad_id=0, eos_ids=())
  prompts = np.random.default_rng(0).integers(
      2, cfg.vocab_size, (PROMPTS, length)).tolist()
  sampling = SamplingConfig(max_new_tokens=new, temperature=1.0,
                            ignore_eos=True, generations=ROWS)
  decoded, leaves = {}, {}

  def chains():
    out = sampler.generate(prompts, sampling)
    decoded['chains'] = int(jax.device_get(out.lengths).sum())
    leaves['chains'] = PROMPTS * ROWS
    jax.device_get(out.tokens)

  def grown():
    out = sampler.generate_tree(prompts, sampling, SHAPE)
    decoded['tree'], leaves['tree'] = out.decoded(), int(out.active.sum())
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
  per_leaf = {n: statistics.median(s) / leaves[n]
              for n, s in seconds.items()}
  return dict(
      workload=workload, prompts=PROMPTS, leaves=leaves, new_tokens=new,
      tree=vars(SHAPE),
      seconds_per_leaf={n: round(v, 5) for n, v in per_leaf.items()},
      decoded_tokens_per_leaf={n: round(decoded[n] / leaves[n], 1)
                               for n in decoded},
      speedup=round(per_leaf['chains'] / per_leaf['tree'], 2))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--workloads', default='small,large')
  for workload in parser.parse_args().workloads.split(','):
    print(json.dumps(run(workload)), flush=True)


if __name__ == '__main__':
  main()
