"""A training job's programs, built once.

`build` makes the policy on its mesh (with LoRA when asked), splits it into
trainable parameters and frozen state, and makes the optimizer, the train
state and the jitted train step: from arrays for a run, from shapes (with
their shardings, nothing allocated) for a compile-only check. A job's `run`
and its `compile_plan` both start from the same `build`, so the compile-only
report covers exactly the programs the run compiles.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
from typing import Any

from flax import nnx
import jax

from tunix_pw.models import decoder
from tunix_pw.train import optim, plans, setup
from tunix_pw.train import step as step_lib

LossFn = Callable[..., Any]  # (model, batch, rng) -> (loss_sum, sums)


@dataclasses.dataclass(frozen=True)
class Program:
  """A trained model (the policy, or PPO's critic) and its train step, on
  `mesh`."""

  mesh: Any
  graphdef: nnx.GraphDef  # of the trainable split
  full_graphdef: nnx.GraphDef  # of the whole model
  params: nnx.State  # trainable: arrays, or shapes with shardings
  frozen: nnx.State | None  # the rest (a LoRA base), or None
  state: step_lib.TrainState
  train_step: Any  # step(state, batch) -> (state, metrics); `.func` lowers
  init: Any = None  # the random init's program (setup.init_program)

  def model(self, params: nnx.State | None = None) -> nnx.Module:
    """The whole model with `params` (default: the initial ones)."""
    params = self.params if params is None else params
    return nnx.merge(self.graphdef, params,
                     *([] if self.frozen is None else [self.frozen]))


def build(config: Any, mesh: Any, loss_fn: LossFn, *, micro_batches: int,
          total_updates: int, abstract: bool) -> Program:
  """The policy of `config` on `mesh` and its train step, which
  accumulates `loss_fn` over `micro_batches` per update; the optimizer's
  schedule spans `total_updates`."""
  model = (plans.abstract_policy(config, mesh) if abstract
           else setup.policy(config, mesh)[0])
  return from_model(model, mesh, loss_fn, use_lora=config.lora.rank > 0,
                    optimizer=config.optimizer, seed=config.seed,
                    micro_batches=micro_batches, total_updates=total_updates,
                    abstract=abstract,
                    unroll_on_cpu=config.model.unroll_cpu_train,
                    init=setup.init_program(config.model, seed=config.seed,
                                            mesh=mesh, rules=config.sharding))


def from_model(model: nnx.Module, mesh: Any, loss_fn: LossFn, *,
               use_lora: bool, optimizer: Any, seed: int, micro_batches: int,
               total_updates: int, abstract: bool,
               unroll_on_cpu: bool, init: Any = None) -> Program:
  """A trained `model` (arrays, or shapes with shardings when `abstract`)
  on `mesh`, its optimizer (an optimizer block) and train step; with
  `unroll_on_cpu`, a step on CPU devices runs the layers unscanned
  (`decoder.unrolled`; the other programs keep the scan). `init`: the
  program that drew its initial parameters (setup.init_program), for
  compile-only checks."""
  graphdef, params, frozen = setup.split(model, use_lora)
  transform, schedule = optim.make(optimizer, total_updates)
  state = (step_lib.TrainState.abstract(params, transform) if abstract else
           step_lib.TrainState.create(params, transform, seed))
  if unroll_on_cpu and mesh.devices.flat[0].platform == 'cpu':
    loss_fn = functools.partial(_unrolled, loss_fn)
  train_step = step_lib.make_step(
      graphdef, frozen, loss_fn, transform, schedule, micro_batches,
      jax.tree.map(lambda x: x.sharding, state))
  return Program(mesh, graphdef, nnx.graphdef(model), params, frozen, state,
                 train_step, init)


def _unrolled(loss_fn: LossFn, model: nnx.Module, *args: Any) -> Any:
  return loss_fn(decoder.unrolled(model), *args)


def train_phase(program: Program, batch: dict[str, Any],
                **where: str) -> plans.Phase:
  """The compile-only phase of `program`'s train step on `batch`
  (shapes); `where`: its name and role (default: the actor's)."""
  return plans.train_phase(program.train_step, program.state,
                                  program.frozen, batch, init=program.init,
                                  **where)


def resident(program: Program) -> dict[str, int]:
  return plans.actor_resident(program.state, program.frozen)
