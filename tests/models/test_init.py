"""Random init: one program for every mesh of a small model."""

import subprocess
import sys

from tests import helpers

# A fresh process with an empty compilation cache: the init on a second
# mesh compiles nothing (its program comes from the cache), and every mesh
# gets the same values in its own shardings.
SCRIPT = """
import sys
import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh
jax.config.update('jax_num_cpu_devices', 8)
from tunix_pw.configs import common
from tunix_pw.models import checkpoints, presets
from tunix_pw.runtime import backend
backend.cache_compiled_programs(sys.argv[1])
events = []
jax.monitoring.register_event_listener(lambda event, **_: events.append(event))
def compiled():  # programs compiled, not read from the cache
  return (events.count('/jax/compilation_cache/compile_requests_use_cache')
          - events.count('/jax/compilation_cache/cache_hits'))
rules = dict(common.sharding())
values, compiles = [], []
for shape in ((4, 2), (8, 1)):
  mesh = Mesh(np.array(jax.devices()).reshape(shape), ('fsdp', 'tp'))
  before = compiled()
  model = checkpoints.init(presets.PRESETS['tiny-gemma'], seed=0, mesh=mesh,
                           rules=rules)
  compiles.append(compiled() - before)
  state = nnx.state(model)
  assert all(x.sharding.mesh == mesh for x in jax.tree.leaves(state))
  values.append([np.asarray(x) for x in jax.tree.leaves(state)])
assert compiles[0] > 0 and compiles[1] == 0, compiles
assert all((a == b).all() for a, b in zip(*values))
print('ok')
"""


def test_a_second_mesh_compiles_no_init(tmp_path):
  result = subprocess.run([sys.executable, '-c', SCRIPT, str(tmp_path)],
                          cwd=helpers.ROOT, env=helpers.env(),
                          capture_output=True, text=True, timeout=300)
  assert result.stdout.strip() == 'ok', result.stderr[-3000:]
