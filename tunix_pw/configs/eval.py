"""Eval: greedy exact match (or the reference completions' loss) of a model
on a held-out split.

  python -m tunix_pw.main --config=tunix_pw/configs/eval.py:runlocal \
      --config.model.checkpoint=/tmp/sft --workdir=/tmp/eval
  python -m tunix_pw.main --config=tunix_pw/configs/eval.py:gemma2-2b \
      --config.model.checkpoint=/ckpt/gemma-2-2b-it --config.data.name=gsm8k \
      --config.data.manual_dir=/data/gsm8k --config.k=4 --config.n=8 \
      --workdir=/tmp/eval

arg: a model preset, or 'runlocal'. The checkpoint may be a tunix_pw
workdir (its latest checkpoint), a Hugging Face or a Kaggle checkpoint.
"""

import ml_collections

from tunix_pw.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  local = arg in (None, '', 'runlocal')
  c = ml_collections.ConfigDict()
  c.job = 'eval'
  c.seed = 0
  c.model = common.model('tiny-gemma' if local else arg)
  c.data = common.data('arithmetic')
  c.data.max_length = 16 if local else 1024
  c.split = 'test'
  c.mode = 'exact_match'  # or 'loss'
  # exact_match's judge: exact_answer (the last number), math_equal or
  # exact (the whole text).
  c.verifier = 'exact_answer'
  c.examples = 500
  c.batch_size = 100 if local else 32
  c.max_new_tokens = 8 if local else 256
  c.k = 0  # pass@k and maj@k (0: greedy only)
  c.n = 0  # samples per problem for pass@k, at least k (0: k)
  c.temperature = 1.0  # of the pass@k samples
  c.runtime = common.runtime(host_device_count=8 if local else 0)
  c.meshes = common.meshes('collocated', rollout=('fsdp=1,tp=-1', 'all'))
  c.sharding = common.sharding()
  return c
