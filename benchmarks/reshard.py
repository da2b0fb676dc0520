"""Cross-mesh weight transfer: peak memory and rate of reshard.transfer.

A float32 tree shaped like a Gemma decoder (scan-stacked layers, as the
models lay them out) moves from fsdp=4 on devices 0-3 to tp=4 on devices 4-7.
In this fresh process: warm the plans, reset the peak-RSS counter, measure
the first full transfer's peak RSS growth as a multiple of the tree size, then
the median rate of the next transfers beside a per-leaf numpy copy of the same
bytes. Prints one JSON line.

  python benchmarks/reshard.py [--repeats=5] [--group_mib=32] [--layers=6]
      [--vocab=16384]

The same measurement of plain jax.device_put runs in a second fresh process
and is reported beside it. For scale, `xla_pass_gb_s` is the rate of one
jitted elementwise pass over the same tree into fresh buffers (the program
that makes each transfer's source): no XLA-built transfer, which writes at
least one fresh copy, can beat it. Targets: growth <= 1.3x the tree (plain
device_put is about 2x); rate >= 35% of the numpy copy rate.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# Peak RSS must see every allocation: with glibc's adaptive mmap threshold,
# freed buffers stay in the heap and later ones reuse them unseen. A fixed
# threshold returns large buffers to the OS on free. Set before start.
if 'MALLOC_MMAP_THRESHOLD_' not in os.environ:
  os.environ['MALLOC_MMAP_THRESHOLD_'] = str(128 << 10)
  os.execv(sys.executable, [sys.executable, *sys.argv])
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_num_cpu_devices', 8)

from tunix_pw.configs import common  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.runtime import backend, meshes, reshard, sharding  # pylint: disable=g-import-not-at-top,wrong-import-position

# Gemma-style decoder, by default ~450 MB of float32: d 1024, 8 query heads
# and 1 KV head of 128, MLP 8192, 6 layers (stacked), vocab 16384
# (--layers and --vocab scale it: ~105 MB a layer, 4 KB a vocabulary row).
D, H, K, HD, F = 1024, 8, 1, 128, 8192


def decoder(L: int, V: int) -> dict:  # pylint: disable=invalid-name
  """Leaf shapes and logical axes."""
  return {
      'embedder': ((V, D), ('vocab', 'embed')),
      'final_norm': ((D,), ('embed',)),
      'layers': {
          'attn_norm': ((L, D), (None, 'embed')),
          'q': ((L, D, H, HD), (None, 'embed', 'heads', None)),
          'k': ((L, D, K, HD), (None, 'embed', 'kv_heads', None)),
          'v': ((L, D, K, HD), (None, 'embed', 'kv_heads', None)),
          'o': ((L, H, HD, D), (None, 'heads', None, 'embed')),
          'mlp_norm': ((L, D), (None, 'embed')),
          'gate': ((L, D, F), (None, 'embed', 'mlp')),
          'up': ((L, D, F), (None, 'embed', 'mlp')),
          'down': ((L, F, D), (None, 'mlp', 'embed')),
      },
  }


_IS_SPEC = lambda x: isinstance(x, tuple) and isinstance(x[0], tuple)


def _status(key: str) -> int:
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(key):
        return int(line.split()[1]) * 1024
  raise KeyError(key)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--mode', default='two_hop',
                      choices=['two_hop', 'device_put'])
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--group_mib', type=int, default=32)
  parser.add_argument('--layers', type=int, default=6)
  parser.add_argument('--vocab', type=int, default=16384)
  args = parser.parse_args()
  leaves = decoder(args.layers, args.vocab)

  runtime = backend.Runtime('local', 'benchmark', 0, 1, tuple(jax.devices()))
  role_meshes = meshes.build(common.meshes(
      'disaggregated', actor=('fsdp=4,tp=1', '0:4'),
      rollout=('fsdp=1,tp=4', '4:8')), runtime.devices)
  rules = common.sharding()

  def shardings(mesh):
    return jax.tree.map(lambda s: sharding.named(mesh, s[0], s[1], rules),
                        leaves, is_leaf=_IS_SPEC)

  src_sh = shardings(role_meshes['actor'])
  dst_sh = shardings(role_meshes['rollout'])
  rng = np.random.default_rng(0)
  tree = jax.tree.map(
      lambda s, sh: jax.device_put(
          rng.standard_normal(s[0], dtype=np.float32), sh),
      leaves, src_sh, is_leaf=_IS_SPEC)
  tree_bytes = sum(x.nbytes for x in jax.tree.leaves(tree))
  group_bytes = args.group_mib << 20

  def move(x, target=dst_sh):
    if args.mode == 'device_put':
      return jax.block_until_ready(jax.device_put(x, target))
    moved, _ = reshard.transfer(x, target, runtime,
                                budget=reshard.Budget(group_bytes))
    return jax.block_until_ready(moved)

  # Each transfer moves a fresh copy, as after a train step: a source array
  # remembers its host value once read, which would flatter device_put.
  fresh = jax.jit(lambda t: jax.tree.map(lambda x: x * 1, t),
                  out_shardings=src_sh)

  def timed_transfer():
    """Seconds of one XLA pass over the tree (making the source) and of
    the transfer."""
    start = time.perf_counter()
    source = jax.block_until_ready(fresh(tree))
    made = time.perf_counter()
    moved = move(source)
    seconds = time.perf_counter() - made
    jax.tree.map(lambda y: y.delete(), (moved, source))
    return made - start, seconds

  # Warm the plans: one transfer per distinct (shape, sharding), i.e. leaf.
  source = fresh(tree)
  jax.tree.map(lambda x, s: jax.tree.map(lambda y: y.delete(), (move(x, s), x)),
               source, dst_sh)
  del source

  before = _status('VmRSS')
  with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')
  source = jax.block_until_ready(fresh(tree))
  grown_by_source = _status('VmRSS') - before
  start = time.perf_counter()
  moved = move(source)
  first_seconds = time.perf_counter() - start
  growth = (_status('VmHWM') - before - grown_by_source) / tree_bytes
  jax.tree.map(lambda y: y.delete(), (moved, source))
  del moved, source

  times = [timed_transfer() for _ in range(args.repeats)]
  rate = tree_bytes / statistics.median(t for _, t in times)
  xla_pass = tree_bytes / statistics.median(t for t, _ in times)

  host = [np.asarray(x) for x in jax.tree.leaves(tree)]
  numpy_rates = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    copies = [np.copy(x) for x in host]
    numpy_rates.append(tree_bytes / (time.perf_counter() - start))
    del copies

  numpy_rate = statistics.median(numpy_rates)
  result = dict(
      mode=args.mode, first_transfer_s=round(first_seconds, 3),
      peak_growth_x_tree=round(growth, 3), rate_gb_s=round(rate / 1e9, 3),
      numpy_copy_gb_s=round(numpy_rate / 1e9, 3),
      rate_vs_numpy=round(rate / numpy_rate, 3),
      xla_pass_gb_s=round(xla_pass / 1e9, 3),
      rate_vs_xla_pass=round(rate / xla_pass, 3))
  if args.mode == 'device_put':
    print(json.dumps(result))
    return
  baseline = subprocess.run(
      [sys.executable, __file__, '--mode=device_put',
       f'--repeats={args.repeats}', f'--layers={args.layers}',
       f'--vocab={args.vocab}'], capture_output=True, text=True,
      check=True).stdout.strip().splitlines()[-1]
  print(json.dumps(dict(
      benchmark='reshard', tree_mb=round(tree_bytes / 2**20),
      group_mib=args.group_mib, **result, device_put=json.loads(baseline),
      targets=dict(peak_growth_x_tree=1.3, rate_vs_numpy=0.35))))


if __name__ == '__main__':
  main()
