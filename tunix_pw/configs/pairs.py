"""Preference pairs from a checkpoint's own samples (see jobs/pairs.py).

  python -m tunix_pw.main --config=tunix_pw/configs/pairs.py:runlocal \
      --config.model.checkpoint=/tmp/demo/sft --config.output_dir=/tmp/pairs \
      --workdir=/tmp/pairs_job
  python -m tunix_pw.main --config=tunix_pw/configs/reward_model.py:runlocal \
      --config.model.checkpoint=/tmp/demo/sft --config.data.name=preferences \
      --config.data.manual_dir=/tmp/pairs --workdir=/tmp/rm

arg: a model preset, or 'runlocal' (the demo's arithmetic task, tiny Gemma
architecture, character tokenizer).
"""

import ml_collections

from tunix_pw.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  local = arg in (None, '', 'runlocal')
  c = ml_collections.ConfigDict()
  c.job = 'pairs'
  c.seed = 0
  c.model = common.model('tiny-gemma' if local else arg)
  c.data = common.data('arithmetic' if local else 'gsm8k')
  c.format = 'pairs'  # pairs (preferences) | unpaired (labelled, for KTO)
  c.samples = 8  # completions per prompt
  c.train_prompts = 4000 if local else 20000  # prompts sampled per split
  c.test_prompts = 1000 if local else 2000
  c.batch_size = 64 if local else 32  # prompts per generate call
  c.sampling = ml_collections.ConfigDict(dict(
      max_new_tokens=6 if local else 512, temperature=1.0, top_k=0, top_p=1.0,
      seed=0))
  c.output_dir = ''  # receives train.jsonl and test.jsonl
  c.runtime = common.runtime(host_device_count=8 if local else 0)
  c.meshes = common.meshes('collocated', rollout=('fsdp=1,tp=4' if local
                                                  else 'fsdp=1,tp=-1',
                                                  '0:4' if local else 'all'))
  c.sharding = common.sharding()
  return c
