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
  has = [bool(x.addressable_shards) for x in leaves]
  owners = multihost_utils.process_allgather(np.array(has, np.int32))
  owners = np.asarray(owners).reshape(jax.process_count(), len(leaves))
  out = []
  for i, value in enumerate(values):
    source = int(np.argmax(owners[:, i]))  # the first process holding it
    out.append(np.asarray(multihost_utils.broadcast_one_to_all(
        value, is_source=jax.process_index() == source)))
  return jax.tree.unflatten(treedef, out)
