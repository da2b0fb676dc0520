"""A model from any checkpoint directory (or a fresh init), placed straight
into its shardings on a role's mesh.

Formats: Hugging Face (config.json + safetensors), Kaggle Gemma (Orbax
params tree; the preset names the architecture). Every parameter is built
shard by shard from host views of its tensors, so no device ever holds an
unsharded weight and the host never holds the model twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import os
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, SingleDeviceSharding
import numpy as np

from tunix_pw import checks
from tunix_pw import workdir as workdir_lib
from tunix_pw.errors import UsageError
from tunix_pw.models import decoder, hf, kaggle, safetensors_io
from tunix_pw.models.config import ModelConfig
from tunix_pw.runtime import sharding

HF, KAGGLE = 'hf', 'kaggle'


def param_shardings(state: nnx.State, mesh: Mesh, rules: Any) -> nnx.State:
  """NamedShardings for (abstract) parameters, from their logical axes."""
  return jax.tree.map(
      lambda v: v.replace(sharding.named(
          mesh, v.get_value().shape, v.get_metadata()['axes'], rules)),
      state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def detect(directory: str) -> str:
  if not os.path.isdir(directory):
    raise UsageError(f'checkpoint directory {directory} does not exist.')
  if os.path.exists(os.path.join(directory, hf.CONFIG)):
    return HF
  if kaggle.is_kaggle(directory):
    return KAGGLE
  raise UsageError(f'{directory} is neither a Hugging Face checkpoint '
                   '(config.json + safetensors) nor a Kaggle/Orbax one.')


def place(views: Sequence[Callable[[], np.ndarray]], shape, dtype, target,
          stacked: bool, name: str) -> jax.Array:
  """One parameter, shard by shard: each device's index is sliced out of the
  host views (one per stacked layer, or one)."""
  expected = tuple(shape[1:]) if stacked else tuple(shape)
  for view in views[:1]:
    if tuple(view().shape) != expected:
      raise UsageError(f'checkpoint tensor for {name} has shape '
                       f'{tuple(view().shape)}, expected {expected}.')

  def shard(index: tuple[slice, ...]) -> np.ndarray:
    if not stacked:
      return np.asarray(views[0]()[index], dtype=dtype)
    return np.stack([np.asarray(view()[index[1:]], dtype=dtype)
                     for view in views[index[0]]])

  return jax.make_array_from_callback(tuple(shape), target, shard, dtype=dtype)


def load(directory: str, cfg: ModelConfig | None = None, *,
         mesh: Mesh | None = None, rules: Any = None,
         **model_kwargs) -> tuple[decoder.Decoder, ModelConfig]:
  """The model in `directory`, on `mesh` (or the first device).

  `cfg` is required for Kaggle checkpoints (they ship no config) and checked
  against the checkpoint's shapes; Hugging Face ones bring their own."""
  kind = detect(directory)
  if kind == HF:
    cfg = hf.read_config(directory)
  elif cfg is None:
    raise UsageError(f'{directory} is a Kaggle checkpoint, which names no '
                     'architecture: give the model preset too.')
  return load_into(directory, kind, decoder.abstract(cfg, **model_kwargs),
                   cfg, mesh, rules), cfg


def load_into(directory: str, kind: str, model: nnx.Module, cfg: ModelConfig,
              mesh: Mesh | None, rules: Any) -> nnx.Module:
  """`model` (abstract: a decoder, or a value model around one) with the
  checkpoint's weights, placed on `mesh`."""
  graphdef, state = nnx.split(model)
  views = (hf.sources if kind == HF else kaggle.sources)(directory, cfg, state)
  targets = dict(param_shardings(state, mesh, rules).flat_state()) if mesh \
      else {}
  placed = []
  for path, var in state.flat_state():
    target = (targets[path].get_value() if path in targets
              else SingleDeviceSharding(jax.devices()[0]))
    value = var.get_value()
    placed.append((path, var.replace(place(
        views[path], value.shape, value.dtype, target,
        stacked=hf.stacked(path),
        name='/'.join(map(str, path))))))
  return nnx.merge(graphdef, nnx.from_flat_state(placed))


# A model up to this size is initialised on one device, then placed.
ONE_DEVICE_INIT_BYTES = 1 << 30


def init(cfg: ModelConfig, seed: int = 0, *, mesh: Mesh | None = None,
         rules: Any = None, **model_kwargs) -> decoder.Decoder:
  """A randomly initialised model in its shardings (`init_program`)."""
  graphdef = nnx.graphdef(decoder.abstract(cfg, **model_kwargs))
  create, shardings = init_program(cfg, seed, mesh=mesh, rules=rules,
                                   **model_kwargs)
  if shardings is None:
    return nnx.merge(graphdef, create())
  # Through the host: a device-to-device placement compiles a program per
  # array and sharding.
  return nnx.merge(graphdef, jax.device_put(jax.device_get(create()),
                                            shardings))


def init_program(cfg: ModelConfig, seed: int = 0, *, mesh: Mesh | None = None,
                 rules: Any = None, **model_kwargs) -> tuple[Any, Any]:
  """The jitted program that draws a model's initial parameters, and the
  shardings they are then placed in through the host (None: it makes
  them in place). Up to ONE_DEVICE_INIT_BYTES of parameters on a mesh of
  this process, it runs on the default device: its program is then the
  same whatever the mesh, one entry of the compilation cache for every job
  of the model (random values do not depend on where they are drawn).
  Larger models are created directly in their shardings."""
  state = nnx.state(decoder.abstract(cfg, **model_kwargs))
  out = None if mesh is None else param_shardings(state, mesh, rules)
  create = lambda: nnx.split(decoder.Decoder(
      cfg, rngs=nnx.Rngs(seed), **model_kwargs))[1]
  size = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
  if out is None or mesh.is_multi_process or size > ONE_DEVICE_INIT_BYTES:
    return jax.jit(create, out_shardings=out), None
  return jax.jit(create), out


DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


def check_model_block(block: Any, prefix: str = '--config.model') -> None:
  """Static checks of a config's model block."""
  from tunix_pw.models import presets  # pylint: disable=g-import-not-at-top
  if block.preset not in presets.PRESETS:
    raise UsageError(f'{prefix}.preset={block.preset!r} is unknown; use one '
                     f'of {", ".join(presets.PRESETS)}.')
  for field in ('param_dtype', 'dtype'):
    if block[field] not in DTYPES:
      raise UsageError(f'{prefix}.{field}={block[field]!r} is unknown; use '
                       f'one of {", ".join(DTYPES)}.')
  if block.remat not in decoder.REMAT_POLICIES:
    raise UsageError(f'{prefix}.remat={block.remat!r} is unknown; use one of '
                     f'{", ".join(decoder.REMAT_POLICIES)}.')
  if block.checkpoint and checks.scope().files:
    if not os.path.isdir(block.checkpoint):
      raise UsageError(f'{prefix}.checkpoint={block.checkpoint!r} is not a '
                       'directory.')
    check_files(block.checkpoint)


def check_files(directory: str) -> None:
  """What a Hugging Face checkpoint's files say without a tensor's bytes
  read: config.json, the index and every safetensors header hold together
  (a static check: a corrupt or truncated file fails before any device
  work, and before the workdir is written)."""
  if workdir_lib.is_trained(directory) or detect(directory) != HF:
    return
  hf.read_config(directory)
  store = safetensors_io.SafetensorsDir(directory)
  for name in store.names():
    store.get(name)


def model_kwargs(block: Any) -> dict[str, Any]:
  """The Decoder arguments a model block sets besides the architecture."""
  return dict(param_dtype=DTYPES[block.param_dtype],
              dtype=DTYPES[block.dtype], scan=block.scan, remat=block.remat,
              microbatches=block.pipeline_microbatches)


def from_block(block: Any, *, seed: int = 0, mesh: Mesh | None = None,
               rules: Any = None) -> tuple[decoder.Decoder, ModelConfig]:
  """The model a config's model block describes: its checkpoint, or a random
  init of its preset."""
  from tunix_pw.models import presets  # pylint: disable=g-import-not-at-top
  cfg = presets.PRESETS[block.preset]
  if block.checkpoint:
    return load(block.checkpoint, cfg, mesh=mesh, rules=rules,
                **model_kwargs(block))
  return init(cfg, seed, mesh=mesh, rules=rules, **model_kwargs(block)), cfg
