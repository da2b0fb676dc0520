"""Data: build a dataset (TFDS, array_record) and read it through its
pipeline once, reporting what the pipeline makes of it.

  python -m tunix_pw.main --config=tunix_pw/configs/data.py:gsm8k \
      --config.data.manual_dir=/data/gsm8k --workdir=/tmp/data

arg: the dataset (arithmetic, gsm8k, preferences, unpaired, chat, code).
"""

import ml_collections

from tunix_pw.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.job = 'data'
  c.seed = 0
  c.data = common.data(arg or 'arithmetic')
  c.tokenizer = 'char'  # or a directory with tokenizer.json / .model
  c.split = 'train'
  c.batch_size = 64
  c.max_batches = 0  # 0: one epoch
  c.dump = False  # write the example indices each process read
  c.runtime = common.runtime(host_device_count=8)
  c.meshes = common.meshes('collocated', actor=('fsdp=-1', 'all'))
  c.sharding = common.sharding()
  return c
