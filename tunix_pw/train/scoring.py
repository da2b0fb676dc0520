"""The frozen scoring role: a model that only runs forward passes
(log-probabilities now; values, reward-model scores and a teacher's logits
are its next users) on its own role mesh or a shared one. It is built once
and never trained; the jitted programs that read it take its state as an
argument. GRPO's and DPO's reference policy is its first user."""

from __future__ import annotations

import dataclasses
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp

from tunix_pw.models import checkpoints
from tunix_pw.runtime import reshard
from tunix_pw.train import setup


@dataclasses.dataclass(frozen=True)
class Scorer:
  graphdef: nnx.GraphDef
  state: nnx.State
  mesh: Any


def reference_mesh(config: Any, meshes: Any):
  """Where the reference lives: a LoRA policy's base (on the actor mesh),
  else the reference role (or the actor's devices)."""
  if config.lora.rank or 'reference' not in meshes.by_role:
    return meshes['actor']
  return meshes['reference']


def reference(config: Any, policy: Any, meshes: Any,
              runtime: Any) -> Scorer:
  """The frozen initial policy (`policy`: a train.program.Program). A LoRA
  policy's reference is its own base with zero adapters, sharing the
  frozen arrays (no copy); otherwise the initial policy is copied onto the
  reference mesh."""
  mesh = reference_mesh(config, meshes)
  if policy.frozen is not None:
    zeros = jax.tree.map(jnp.zeros_like, policy.params)
    return Scorer(policy.full_graphdef, nnx.state(policy.model(zeros)), mesh)
  state = nnx.state(policy.model())
  moved, _ = reshard.transfer(state, checkpoints.param_shardings(
      state, mesh, config.sharding), runtime,
                              budget=reshard.Budget.from_block(config.runtime))
  return Scorer(policy.full_graphdef, moved, mesh)


def from_block(block: Any, mesh: Any, rules: Any, seed: int) -> Scorer:
  """A frozen model a model block names (a checkpoint, a trained workdir
  or a preset), on `mesh`."""
  model, _ = setup.model_from_block(block, seed=seed, mesh=mesh, rules=rules)
  graphdef, state = nnx.split(model)
  return Scorer(graphdef, state, mesh)
