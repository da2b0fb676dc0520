"""Host values of small arrays (metrics, checksums) on every process.

In a disaggregated multi-controller run an array may live only on another
process's devices (the rollout mesh on process 1, say), yet every process
needs the value to take the same decisions and process 0 prints it.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec
import numpy as np


def fetch(tree: Any) -> Any:
  """The numpy value of every (small) array in `tree`, on every process.
  A collective in multi-process runs: every process calls it in step."""
  leaves, treedef = jax.tree.flatten(tree)
  # The path must not depend on what this process holds: the others follow
  # the same one, since the collective below needs them all.
  if jax.process_count() == 1:
    return jax.tree.unflatten(treedef, [np.asarray(x) for x in leaves])
  values = []
  for x in leaves:
    if not x.is_fully_replicated:
      x = jax.jit(lambda a: a, out_shardings=NamedSharding(
          x.sharding.mesh, PartitionSpec()))(x)
    values.append(np.asarray(x.addressable_data(0)) if x.addressable_shards
                  else np.zeros(x.shape, x.dtype))
  # One gather of every process's values and what it holds (one collective
  # for the whole tree); each leaf is then its first holder's.
  has = np.array([bool(x.addressable_shards) for x in leaves], np.int32)
  owners, gathered = multihost_utils.process_allgather((has, values))
  out = [np.asarray(g)[int(np.argmax(np.asarray(owners)[:, i]))]
         for i, g in enumerate(gathered)]
  return jax.tree.unflatten(treedef, out)
