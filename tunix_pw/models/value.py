"""A decoder with a scalar head: per-token values (PPO's critic) or, read
at a sequence's last token, a reward model's score.

The head is Hugging Face's `score` of a sequence-classification model (one
label, no bias), so the same module exports to that layout. The decoder's
LM head is dropped: a critic never reads it (an untied one would hold a
vocabulary-sized matrix and its optimizer state for nothing).
"""

from __future__ import annotations

from flax import nnx
import jax
import jax.numpy as jnp

from tunix_pw.errors import UsageError
from tunix_pw.models import checkpoints, hf, layers, safetensors_io
from tunix_pw.models.decoder import Decoder
from tunix_pw.runtime import sharding
from tunix_pw.runtime.sharding import Sharder


class ValueModel(nnx.Module):

  def __init__(self, decoder: Decoder, *, rngs: nnx.Rngs):
    if hasattr(decoder, 'lm_head'):
      del decoder.lm_head
    self.decoder, self.cfg = decoder, decoder.cfg
    # Zeros: every value starts at 0, a neutral baseline.
    self.score = layers.param(rngs, (decoder.cfg.embed_dim, 1),
                              ('embed', None), 0, jnp.float32, 'zeros')

  def __call__(self, tokens: jax.Array, positions: jax.Array,
               segment_ids: jax.Array,
               shard: Sharder = Sharder()) -> jax.Array:
    """Values [B, T] in float32: position t's is the value of the prefix
    through token t (before token t + 1 is chosen)."""
    x, _ = self.decoder.hidden(tokens, positions, segment_ids, shard=shard)
    return jnp.einsum('BTD,DO->BTO', x.astype(jnp.float32),
                      self.score[...])[..., 0]


def last_token(values: jax.Array, segment_ids: jax.Array) -> jax.Array:
  """[B]: each row's value at its last real token (segment > 0; rows are
  right-padded): a reward model's score of the whole sequence."""
  length = (segment_ids > 0).sum(-1)
  return jnp.take_along_axis(values, jnp.maximum(length - 1, 0)[:, None],
                             -1)[:, 0]


def from_decoder(decoder: Decoder, seed: int, mesh=None,
                 rules=None) -> ValueModel:
  """`decoder` (a loaded checkpoint or the policy's copy) with a fresh
  value head, placed like the decoder's parameters on `mesh`."""
  model = ValueModel(decoder, rngs=nnx.Rngs(seed))
  if mesh is not None:
    head = model.score.get_value()
    model.score.set_value(jax.device_put(head, sharding.named(
        mesh, head.shape, model.score.get_metadata()['axes'], rules)))
  return model


def abstract(directory: str) -> ValueModel:
  """The reward model exported to `directory` (a Hugging Face one-label
  sequence classifier, the reward_model job's export) as shapes."""
  if checkpoints.detect(directory) != checkpoints.HF or 'score.weight' not in (
      safetensors_io.SafetensorsDir(directory).names()):
    raise UsageError(f'{directory} is not a Hugging Face sequence classifier '
                     '(no score.weight); export one with the reward_model '
                     'job.')
  cfg = hf.read_config(directory)
  return nnx.eval_shape(lambda: ValueModel(Decoder(cfg, rngs=nnx.Rngs(0)),
                                           rngs=nnx.Rngs(0)))


def load(directory: str, mesh=None, rules=None) -> ValueModel:
  """The reward model exported to `directory` (`abstract`): its decoder
  and `score` head, on `mesh`."""
  model = abstract(directory)
  return checkpoints.load_into(directory, checkpoints.HF, model, model.cfg,
                               mesh, rules)
