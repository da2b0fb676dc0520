"""A reward model trained on preference pairs (Bradley-Terry).

  python -m tunix_pw.main --config=tunix_pw/configs/reward_model.py:runlocal \
      --workdir=/tmp/rm --config.export=/tmp/rm/hf
  python -m tunix_pw.main --config=tunix_pw/configs/reward_model.py:gemma2-2b \
      --config.model.checkpoint=/ckpt/gemma-2-2b-it \
      --config.data.manual_dir=/data/prefs --workdir=/gcs/bucket/rm

arg: a model preset, or 'runlocal' (tiny Gemma; the built-in arithmetic
pairs: the right answer over a near miss). The decoder comes from the
model block (a checkpoint, a trained workdir such as an SFT run, or a
fresh init); the head starts at 0. `export` writes a one-label
sequence classifier that transformers' AutoModelForSequenceClassification
reads.
"""

import ml_collections

from tunix_pw.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  local = arg in (None, '', 'runlocal')
  c = ml_collections.ConfigDict()
  c.job = 'reward_model'
  c.seed = 0
  c.model = common.model('tiny-gemma' if local else arg)
  c.data = common.data('arithmetic' if local else 'preferences')
  c.data.max_length = 16 if local else 1024
  # 1e-3 locally: on pairs from the demo's SFT model, a reward model from
  # an SFT model that solves the task reached 92.6% held-out pairwise
  # accuracy after 800 steps and 98.3% after 1600, and 57.5% at 1e-4 after
  # 800 (its head starts at 0, so the decoder learns only once the head has
  # grown).
  c.optimizer = common.optimizer(learning_rate=1e-3 if local else 1e-5,
                                 warmup_steps=5 if local else 50)
  c.steps = 1600 if local else 2000
  c.batch_size = 32 if local else 64
  c.micro_batches = 1
  c.log_every = 10
  c.eval_every = 0  # steps between held-out evaluations (0: the end only)
  c.eval_batch_size = 100 if local else 64
  c.checkpoint = common.checkpointing(every=50 if local else 500)
  c.export = ''  # a directory: the Hugging Face sequence classifier
  c.runtime = common.runtime(host_device_count=8 if local else 0)
  c.meshes = common.meshes(
      'collocated', actor=('fsdp=4,tp=2' if local else 'fsdp=-1', 'all'))
  c.sharding = common.sharding()
  return c
