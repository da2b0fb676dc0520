"""Blocks shared by the config files. Every field's help is in
configs/field_help.py (`--print_config`, docs/reference.md).

Hyperparameters live in config files only; infrastructure (cluster, TPU type,
image) lives in xpk_configs/.
"""

from __future__ import annotations

import os

import ml_collections


def runtime(host_device_count: int = 0) -> ml_collections.ConfigDict:
  """The runtime block (field help: configs/field_help.py)."""
  return ml_collections.ConfigDict(dict(
      host_device_count=host_device_count,
      compilation_cache_dir=os.path.join(
          os.path.expanduser('~'), '.cache', 'tunix_pw', 'xla'),
      max_inflight=2,
      reshard_group_mib=256,
      peer_timeout_s=300,
      profile_steps='',
      progress_every_s=60.0,
      elastic=dict(min_slices=0, poll_s=10.0, timeout_s=0.0, max_attempts=10),
  ))


def meshes(layout: str, **roles: tuple[str, str]) -> ml_collections.ConfigDict:
  """The meshes block: meshes('disaggregated', actor=('fsdp=4', '0:4'), ...).

  Each role is (axes, devices); see runtime/meshes.py for the grammar.
  """
  block = ml_collections.ConfigDict({'layout': layout})
  for role, (axes, devices) in roles.items():
    block[role] = ml_collections.ConfigDict(dict(axes=axes, devices=devices))
  return block


def sharding() -> ml_collections.ConfigDict:
  """Logical axis -> mesh axes. One rule set serves every role's mesh: an axis
  a mesh lacks (or of size 1) is dropped, so fsdp vs tp is the mesh's shape."""
  return ml_collections.ConfigDict(dict(
      # Rows split over pipeline stages too wherever no pipeline runs
      # (embeddings, logits, sampling); parameters beside the stacked
      # layers over them like FSDP.
      batch='data,fsdp,stage',
      length='sequence',  # activations' tokens (sequence parallelism)
      layers='stage',  # stacked layers (pipeline parallelism)
      embed='fsdp,sequence,stage',
      mlp='tp',
      heads='tp',
      kv_heads='tp',
      vocab='tp',
  ))


def model(preset: str, checkpoint: str = '') -> ml_collections.ConfigDict:
  """The model block (field help: configs/field_help.py)."""
  return ml_collections.ConfigDict(dict(
      preset=preset, checkpoint=checkpoint, tokenizer='',
      param_dtype='float32', dtype='float32', scan=True,
      unroll_cpu_train=True, remat='none', pipeline_microbatches=4))


def data(name: str = 'arithmetic', **arithmetic) -> ml_collections.ConfigDict:
  """The data block (tunix_pw/data/; field help: configs/field_help.py)."""
  return ml_collections.ConfigDict(dict(
      name=name,
      data_dir=os.path.join('~', '.cache', 'tunix_pw', 'tfds'),
      manual_dir='',
      on_bad_line='error',
      arithmetic=dict(dict(digits=2, operations='+', train_size=5000,
                           test_size=1000, seed=0), **arithmetic),
      max_length=64,
      overlong='truncate',
      chat=False,
      packing=False,
      train_examples=0,
  ))


def optimizer(learning_rate: float = 1e-4, warmup_steps: int = 10,
              schedule: str = 'cosine') -> ml_collections.ConfigDict:
  """AdamW (or SGD) with warmup then constant or cosine decay (over
  decay_steps; 0: the run's steps), and gradient clipping by global norm
  (0: off)."""
  return ml_collections.ConfigDict(dict(
      name='adamw', learning_rate=learning_rate, warmup_steps=warmup_steps,
      schedule=schedule, decay_steps=0, end_fraction=0.1, b1=0.9, b2=0.99,
      eps=1e-8,
      weight_decay=0.0, clip_norm=1.0, max_nonfinite_steps=10,
      state_dtype=''))


def lora(rank: int = 0) -> ml_collections.ConfigDict:
  """LoRA adapters (rank 0: off) on the weights whose paths match `targets`
  (by default the decoder's: a vision tower's, 'vision/...', stay frozen);
  quantize='int8' keeps the frozen base in int8 (QLoRA)."""
  return ml_collections.ConfigDict(dict(
      rank=rank, alpha=16.0, quantize='',
      targets=r'(.*/)?groups/.*(attn/(q|k|v|o)|mlp/(gate|up|down))'))


def images() -> ml_collections.ConfigDict:
  """What a data record's images may be, and Gemma 3's pan and scan."""
  return ml_collections.ConfigDict(dict(
      max_per_record=8, max_pixels=4096 * 4096, max_bytes=32 << 20,
      pan_and_scan=False))


def checkpointing(every: int = 100, keep: int = 3) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(every=every, keep=keep,
                                        async_save=True))
