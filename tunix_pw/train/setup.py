"""What every training job sets up before its loop: the policy (with LoRA
when asked) on its mesh, the split into trainable and frozen state, and the
held-out prompts."""

from __future__ import annotations

from typing import Any

from flax import nnx
import jax

from tunix_pw import registry, workdir as workdir_lib
from tunix_pw.data import formats, images
from tunix_pw.data.builders import decode
from tunix_pw.errors import UsageError
from tunix_pw.models import blocks, checkpoints, hf, lora, tokenizers
from tunix_pw.models.decoder import Decoder
from tunix_pw.models.config import ModelConfig
from tunix_pw.models.tokenizers import Tokenizer
from tunix_pw.train import checkpoint as checkpoint_lib
from tunix_pw.train import distill_losses, distill_strategies


def check_lora_block(block: Any) -> None:
  if block.rank < 0 or (block.rank and block.alpha <= 0):
    raise UsageError(f'--config.lora.rank={block.rank} must be >= 0 (0: off) '
                     f'and alpha={block.alpha} positive.')


def check_logit_distillation(d: Any) -> None:
  """The logit loss's settings in `--config.distill` (the distill job's
  and on-policy distillation's)."""
  registry.check('distill_divergence', d.divergence,
                 '--config.distill.divergence')
  if d.temperature <= 0 or not 0 < d.beta < 1 or d.top_k < 0 or d.weight < 0:
    raise UsageError(f'--config.distill.temperature={d.temperature} must be '
                     f'positive, beta={d.beta} in (0, 1), and top_k={d.top_k} '
                     f'and weight={d.weight} at least 0.')


# Text whose ids two tokenizers must agree on (with their vocabulary size
# and special ids) to be the same tokenizer.
PROBE = ''.join(chr(c) for c in range(32, 127)) + ' 12+30=42\nThe answer is'


def check_same_tokenizer(model: Any, teacher: Any) -> None:
  """A teacher's log-probabilities compare with the student's token by
  token: the teacher (a model block) must tokenize as the student (`model`)
  does and share its vocabulary."""
  student_tok, teacher_tok = (blocks.tokenizer(model),
                              blocks.tokenizer(teacher))
  sizes = [blocks.architecture(b).vocab_size for b in (model, teacher)]
  same = (sizes[0] == sizes[1] and all(
      getattr(student_tok, a) == getattr(teacher_tok, a)
      for a in ('vocab_size', 'pad_id', 'bos_id', 'eos_id', 'stop_ids')) and
          student_tok.encode(PROBE) == teacher_tok.encode(PROBE))
  if not same:
    raise UsageError(
        f'the teacher ({blocks.tokenizer_source(teacher)}, {sizes[1]} '
        "logits) does not share the student's tokenizer "
        f'({blocks.tokenizer_source(model)}, {sizes[0]} logits): '
        'distillation compares next-token '
        'distributions id by id.')


def export(config: Any, model: nnx.Module) -> None:
  """`config.export`: the trained `model` (LoRA merged, in place) in the
  Hugging Face layout, with its tokenizer's files beside the weights, so
  that transformers and our own jobs load the directory alone."""
  lora.merge(model)
  detach_projection(model)
  hf.save(config.export, model.cfg, nnx.state(model))
  tokenizers.save(blocks.tokenizer_source(config.model), config.export)


def model_from_block(block: Any, *, seed: int, mesh: Any,
                     rules: Any) -> tuple[Decoder, ModelConfig]:
  """The model a model block names: a tunix_pw workdir's latest trained
  weights (LoRA merged), a Hugging Face or Kaggle checkpoint, or a fresh
  init of the preset."""
  if not workdir_lib.is_trained(block.checkpoint):
    return checkpoints.from_block(block, seed=seed, mesh=mesh, rules=rules)
  trained = blocks.trained_config(block.checkpoint)
  model, cfg = policy(trained, mesh, rules)
  graphdef, params, frozen = split(model, trained.lora.rank > 0)
  params = checkpoint_lib.latest_params(block.checkpoint, params)
  model = nnx.merge(graphdef, params, *([] if frozen is None else [frozen]))
  lora.merge(model)
  detach_projection(model)
  return model, cfg


def init_program(block: Any, *, seed: int, mesh: Any, rules: Any) -> Any:
  """The program that draws the initial parameters of the model a block
  names when it has no checkpoint (`checkpoints.init_program`), or None."""
  if block.checkpoint:
    return None
  return checkpoints.init_program(blocks.architecture(block), seed, mesh=mesh,
                                  rules=rules,
                                  **checkpoints.model_kwargs(block))[0]


def policy(config: Any, mesh: Any,
           rules: Any = None) -> tuple[Decoder, ModelConfig]:
  """The model of `config.model`, on `mesh`, with LoRA adapters (and an int8
  base for QLoRA) when `config.lora.rank` > 0, and what `attach` adds."""
  rules = config.sharding if rules is None else rules
  model, cfg = model_from_block(config.model, seed=config.seed, mesh=mesh,
                                rules=rules)
  if attach(model, config):
    # Adapters (an int8 base, a projection) were made on one device: shard
    # them like their base weights.
    added = nnx.state(model, nnx.Any(lora.LoRAParam, lora.QuantizedBase))
    nnx.update(model, jax.device_put(added, checkpoints.param_shardings(
        added, mesh, rules)))
  return model, cfg


def attach(model: Decoder, config: Any) -> bool:
  """Adds what `config` trains beyond the model's own weights: LoRA
  adapters, and feature distillation's projection (train/distill_losses.py).
  Returns whether anything was added."""
  if config.lora.rank:
    lora.apply(model, config.lora.targets, config.lora.rank,
               config.lora.alpha, seed=config.seed,
               quantize=config.lora.quantize)
  strategy = config.get('distill', {}).get('strategy')  # the distill job's
  projection = strategy and distill_strategies.get(strategy).projection
  if projection:
    distill_losses.attach_projection(model, config)
  return bool(config.lora.rank or projection)


def detach_projection(model: nnx.Module) -> None:
  """Drops a feature-distilled student's projection
  (train/distill_losses.py): the model is an ordinary one again, for
  export and for loads."""
  if hasattr(model, 'distill_projection'):
    del model.distill_projection


def split(model: nnx.Module, use_lora: bool):
  """(graphdef, trainable, frozen): LoRA trains adapters only."""
  if use_lora:
    return nnx.split(model, lora.LoRAParam, ...)
  graphdef, params = nnx.split(model)
  return graphdef, params, None


def image_processing(data: Any, model: Any) -> images.Processing | None:
  """The image preprocessing of a data block read by a model block's
  vision-language model (None for data without images)."""
  if data.name not in formats.PICTURED:
    return None
  cfg = blocks.architecture(model)
  if not cfg.vision:
    raise UsageError(f'--config.data.name={data.name!r} has images, but '
                     f'the {cfg.family} model has no vision tower.')
  return images.Processing.for_model(blocks.tokenizer_source(model),
                                     cfg.vision)


def heldout(name: str, source: Any, tokenizer: Tokenizer, count: int,
            chat: bool, processing: Any = None
            ) -> tuple[list[list[int]], list[str], list[Any] | None]:
  """The first `count` examples of a held-out split (a fixed set): prompts
  as token ids, their reference answers, and with `processing` (a
  vision-language model's) their images (else None)."""
  prompts, answers, pixels = [], [], []
  for i in range(min(count, len(source))):
    example = dict(decode(source[i]), index=i)
    ids, own = formats.prompt_ids(name, example, tokenizer, chat, processing)
    prompts.append(ids)
    pixels.append(own)
    answers.append(formats.reference_answer(name, example))
  return prompts, answers, pixels if processing else None
