"""Smoke job: a sharded train-like loop on the actor mesh and a transfer of
its parameters to the rollout mesh. Proves the runtime end to end.

  python -m tunix_pw.main --config=tunix_pw/configs/smoke.py \
      --workdir=/tmp/smoke
  python -m tunix_pw.main --config=tunix_pw/configs/smoke.py:collocated \
      --workdir=/tmp/smoke
"""

import ml_collections

from tunix_pw.configs import common

LAYOUTS = {
    'disaggregated': dict(actor=('fsdp=4,tp=1', '0:4'),
                          rollout=('fsdp=1,tp=4', '4:8')),
    'collocated': dict(actor=('fsdp=4,tp=2', 'all'),
                       rollout=('fsdp=1,tp=8', 'all')),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  layout = arg or 'disaggregated'
  if layout not in LAYOUTS:
    raise ValueError(f'unknown arg {arg!r}; use one of {", ".join(LAYOUTS)}')
  c = ml_collections.ConfigDict()
  c.job = 'smoke'
  c.seed = 0
  c.steps = 8
  c.batch_size = 32
  c.learning_rate = 0.05
  c.model = ml_collections.ConfigDict(dict(preset='tiny'))
  c.runtime = common.runtime(host_device_count=8)
  c.meshes = common.meshes(layout, **LAYOUTS[layout])
  c.sharding = common.sharding()
  return c
