"""SFT: full or LoRA/QLoRA fine-tuning on arithmetic, gsm8k or chat data.

  python -m tunix_pw.main --config=tunix_pw/configs/sft.py:runlocal \
      --workdir=/tmp/sft
  python -m tunix_pw.main --config=tunix_pw/configs/sft.py:gemma2-2b \
      --config.model.checkpoint=/ckpt/gemma-2-2b --config.data.name=chat \
      --config.data.manual_dir=/data/chat --config.lora.rank=16 \
      --workdir=/gcs/bucket/sft

arg: a model preset name, or 'runlocal' (a tiny Gemma on arithmetic with the
character tokenizer, 8 virtual CPU devices as fsdp=4 x tp=2).
"""

import ml_collections

from tunix_pw.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  local = arg in (None, '', 'runlocal')
  c = ml_collections.ConfigDict()
  c.job = 'sft'
  c.seed = 0
  c.model = common.model('tiny-gemma' if local else arg)
  c.lora = common.lora()
  c.data = common.data('arithmetic')
  c.data.max_length = 16 if local else 1024
  c.optimizer = common.optimizer(learning_rate=3e-3 if local else 1e-5,
                                 warmup_steps=20 if local else 100)
  c.steps = 300 if local else 2000
  c.batch_size = 64 if local else 128
  c.micro_batches = 1
  c.logits_chunk = 0  # positions per chunk of logits (0: by vocabulary)
  c.log_every = 20
  c.eval_every = 0  # steps between held-out evaluations; 0: at the end only
  # Stop once an eval_every evaluation reaches this accuracy (0: off).
  c.stop_at_accuracy = 0.0
  c.eval_examples = 500
  c.eval_batch_size = 100 if local else 64
  c.eval_max_new_tokens = 8 if local else 256
  # How a held-out completion is judged: exact_answer (its last number),
  # math_equal or exact (the whole text).
  c.eval_verifier = 'exact_answer'
  c.checkpoint = common.checkpointing(every=100 if local else 500)
  c.export = ''  # a directory: the final model and tokenizer, HF layout
  c.runtime = common.runtime(host_device_count=8 if local else 0)
  c.meshes = common.meshes(
      'collocated', actor=('fsdp=4,tp=2' if local else 'fsdp=-1', 'all'))
  c.sharding = common.sharding()
  return c
