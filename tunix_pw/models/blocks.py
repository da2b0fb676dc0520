"""Model blocks (`config.model`, a teacher's, a judge's) read from
shapes alone: the architecture and the tokenizer a block names, whether
it is a preset, a Hugging Face checkpoint or a trained workdir."""

from __future__ import annotations

import json
import os
from typing import Any

import ml_collections

from tunix_pw import workdir as workdir_lib
from tunix_pw.models import checkpoints, hf, presets, tokenizers
from tunix_pw.models.config import ModelConfig
from tunix_pw.models.tokenizers import Tokenizer


def trained_config(workdir: str) -> ml_collections.ConfigDict:
  """The config a trained workdir was trained with."""
  return ml_collections.ConfigDict(json.loads(workdir_lib.read_text(
      workdir_lib.path(workdir, workdir_lib.CONFIG))))


def architecture(block: Any) -> ModelConfig:
  """A model block's architecture, from shapes only: a trained workdir's
  model, a visible Hugging Face checkpoint's config, or the preset."""
  if workdir_lib.is_trained(block.checkpoint):
    return architecture(trained_config(block.checkpoint).model)
  if (block.checkpoint and os.path.isdir(block.checkpoint) and
      checkpoints.detect(block.checkpoint) == checkpoints.HF):
    return hf.read_config(block.checkpoint)
  return presets.PRESETS[block.preset]


def tokenizer_source(block: Any) -> str:
  """Where a model block's tokenizer lives: its own, its checkpoint's, a
  trained workdir's, or 'char' (the built-in character tokenizer)."""
  if block.tokenizer:
    return block.tokenizer
  if workdir_lib.is_trained(block.checkpoint):
    return tokenizer_source(trained_config(block.checkpoint).model)
  return block.checkpoint or 'char'


def tokenizer(block: Any) -> Tokenizer:
  return tokenizers.load(tokenizer_source(block))
