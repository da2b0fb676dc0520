"""DPO / IPO / ORPO / KTO preference tuning (--config.dpo.algorithm).

  python -m tunix_pw.main --config=tunix_pw/configs/dpo.py:runlocal \
      --workdir=/tmp/dpo
  python -m tunix_pw.main --config=tunix_pw/configs/dpo.py:runlocal \
      --config.dpo.algorithm=orpo --workdir=/tmp/orpo
  python -m tunix_pw.main --config=tunix_pw/configs/dpo.py:runlocal \
      --config.dpo.algorithm=kto --workdir=/tmp/kto
  python -m tunix_pw.main --config=tunix_pw/configs/dpo.py:gemma2-2b \
      --config.model.checkpoint=/ckpt/gemma-2-2b-it \
      --config.data.manual_dir=/data/prefs --workdir=/gcs/bucket/dpo

arg: a model preset, or 'runlocal' (tiny Gemma; the built-in arithmetic
preference pairs: right answer over a near miss). KTO reads labelled
examples (`--config.data.name=unpaired`: {"prompt", "completion", "label"})
or splits each pair into a desirable and an undesirable example (a batch of
B pairs is 2B examples). Pair data is evaluated on its test split: the share
of held-out pairs the policy prefers the right way.
"""

import ml_collections

from tunix_pw.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  local = arg in (None, '', 'runlocal')
  c = ml_collections.ConfigDict()
  c.job = 'dpo'
  c.seed = 0
  c.model = common.model('tiny-gemma' if local else arg)
  c.lora = common.lora()
  c.data = common.data('arithmetic' if local else 'preferences')
  c.data.max_length = 16 if local else 1024
  c.dpo = ml_collections.ConfigDict(dict(
      algorithm='dpo',  # dpo | ipo | orpo | kto
      beta=0.1,
      orpo_lambda=0.1,
      # KTO's weights of desirable and undesirable examples (lambda_D,
      # lambda_U): the paper keeps lambda_D n_D / (lambda_U n_U) in [1, 4/3].
      kto_lambda_desirable=1.0,
      kto_lambda_undesirable=1.0))
  c.optimizer = common.optimizer(learning_rate=1e-3 if local else 5e-7,
                                 warmup_steps=5 if local else 100)
  c.steps = 50 if local else 1000
  c.batch_size = 32 if local else 64
  c.micro_batches = 1
  c.logits_chunk = 0  # positions per chunk of logits (0: by vocabulary)
  c.log_every = 10
  c.eval_every = 0  # steps between held-out evaluations (0: the end only)
  c.eval_batch_size = 100 if local else 64
  c.checkpoint = common.checkpointing(every=50 if local else 500)
  c.export = ''  # a directory: the final model and tokenizer, HF layout
  c.runtime = common.runtime(host_device_count=8 if local else 0)
  c.meshes = common.meshes(
      'collocated', actor=('fsdp=4,tp=2' if local else 'fsdp=-1', 'all'),
      reference=('fsdp=4,tp=2' if local else 'fsdp=-1', 'actor'))
  c.sharding = common.sharding()
  return c
