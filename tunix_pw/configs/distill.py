"""Distillation: a student learns from a frozen teacher's next-token
distributions, mixed with the data's NLL (jobs/distill.py).

  python -m tunix_pw.main --config=tunix_pw/configs/sft.py:runlocal \
      --config.steps=3000 --workdir=/tmp/teacher          # a strong teacher
  python -m tunix_pw.main --config=tunix_pw/configs/distill.py:runlocal \
      --config.teacher.checkpoint=/tmp/teacher --workdir=/tmp/distill
  python -m tunix_pw.main --config=tunix_pw/configs/distill.py:gemma3-1b \
      --config.teacher=... --config.data.name=chat \
      --config.data.manual_dir=/data/chat --workdir=/gcs/bucket/distill

arg: the student's preset, or 'runlocal' (a tiny Gemma student that sees
only 1,000 training problems of the arithmetic task, the data-limited
regime where a teacher's soft labels help; the teacher role shares the
actor's devices). `--config.meshes.layout=disaggregated` with
`--config.meshes.actor.devices=0:4 --config.meshes.teacher.devices=4:8`
puts the teacher on its own mesh; its outputs then move by reshard.
"""

import ml_collections

from tunix_pw.configs import common, sft


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  local = arg in (None, '', 'runlocal')
  c = sft.get_config(arg)
  c.job = 'distill'
  c.teacher = common.model('tiny-gemma' if local else arg)
  c.distill = ml_collections.ConfigDict(dict(
      divergence='forward_kl',  # forward_kl | reverse_kl | jsd
      beta=0.5,  # jsd's mixture weight of the teacher
      temperature=1.0,
      top_k=0,  # the teacher's k largest logits only (0: all)
      weight=1.0,  # of the divergence
      sft_weight=1.0,  # of the data's NLL
  ))
  if local:
    c.data.train_examples = 1000
    c.steps = 600
    c.eval_every = 100
  c.meshes = common.meshes(
      'collocated', actor=('fsdp=4,tp=2' if local else 'fsdp=-1', 'all'),
      teacher=('fsdp=4,tp=2' if local else 'fsdp=-1', 'actor'))
  return c
