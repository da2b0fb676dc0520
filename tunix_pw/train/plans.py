"""Role plans as shapes: what a job compiles, phase by phase, with what
each role keeps resident, built from shapes alone (ShapeDtypeStructs with
shardings) so that a compile-only check (`tunix_pw/compile_only.py`)
lowers the same programs a run compiles, and a test holds the two equal
(`tests/test_compile_plan.py`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
import dataclasses
import math
from typing import Any

from flax import nnx
import jax
import numpy as np

from tunix_pw.models import blocks, checkpoints, decoder
from tunix_pw.runtime import backend, reshard, sharding, topology
from tunix_pw.sampling import sampler as sampler_lib
from tunix_pw.train import loop, scoring, setup


@dataclasses.dataclass
class Phase:
  """One phase of the job on one role's devices.

  compile: returns the phase's compiled programs (on the role's devices).
  resident_args: bytes per device of their arguments that are resident
    state (counted once, under `resident`).
  held: bytes per device the phase holds besides its programs (a weight
    sync: the incoming copy, while the engine still serves the old one).
  inflight: programs of the phase alive at once (a sync's groups in flight).
  bounded: its programs are compiled at the largest shapes the run gives
    them; the run may also compile them at smaller ones that follow its
    data (a generation's prompt bucket, an agent's batch of turns, a last
    chunk of rows), each needing less memory.
  per_step: times the phase runs in a training step (0: not in one: an
    evaluation, a copy made once), for step-time estimates.
  timed: how many of its programs (the first) run each time (None: all;
    a train step's finite check and random init run seldom).
  decode_steps: the most times its programs' loops without a trip count
    run (a generation's decode loop: its new tokens).
  """

  name: str
  role: str
  compile: Callable[[], Sequence[Any]]
  resident_args: int = 0
  held: int = 0
  inflight: int = 1
  note: Callable[[], str] = lambda: ''
  bounded: bool = False
  per_step: float = 1.0
  timed: int | None = None
  decode_steps: int = 0


@dataclasses.dataclass(frozen=True)
class Transfer:
  """Arrays moved from one role's layout to another's, in the run's groups
  and in-flight bound: the weight sync (actor -> rollout), the reference's
  copy of the initial policy, log-probabilities onto the actor."""

  name: str
  sources: Any  # ShapeDtypeStructs with shardings
  targets: Any  # the same, in the destination's shardings
  budget: reshard.Budget
  roles: tuple[str, str] = ('actor', 'rollout')  # from, to
  # The destination holds the incoming copy beside the one it replaces (a
  # weight sync: the engine serves the old weights until the new land).
  held: bool = False
  per_step: float = 1.0  # 0: made once (the reference's copy)


@dataclasses.dataclass
class Plan:
  resident: dict[str, dict[str, int]]  # role -> item -> bytes per device
  phases: list[Phase]
  transfers: list[Transfer] = dataclasses.field(default_factory=list)
  tokens_per_step: int = 0  # trained on (for step-time estimates)

  def all_phases(self, runtime: backend.Runtime) -> list[Phase]:
    """The phases, then each transfer's programs as the backend's rung
    would move it."""
    return self.phases + [phase for t in self.transfers
                          for phase in transfer_phases(t, runtime)]


def transfer_phases(transfer: Transfer,
                    runtime: backend.Runtime) -> list[Phase]:
  """A transfer's programs on each side (the rung the backend's run would
  take, reshard.compile_relayouts)."""
  leaves = jax.tree.leaves(transfer.sources)
  targets = jax.tree.leaves(transfer.targets)

  def programs(side):
    return lambda: reshard.compile_relayouts(
        leaves, [x.sharding for x in targets], runtime,
        transfer.budget.group_bytes)[side]

  source, target = transfer.roles
  return [Phase(f'{transfer.name} in', target, programs('target'),
                held=per_device(transfer.targets) if transfer.held else 0,
                inflight=transfer.budget.max_inflight,
                per_step=transfer.per_step),
          Phase(f'{transfer.name} out', source, programs('source'),
                inflight=transfer.budget.max_inflight,
                per_step=transfer.per_step)]


def per_device(tree: Any) -> int:
  """Bytes one device holds of `tree` (arrays or ShapeDtypeStructs with
  shardings; sharding by rule keeps every device's share equal)."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) *
             np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def with_shardings(state: nnx.State, shardings: nnx.State) -> nnx.State:
  """Abstract `state` carrying the matching `shardings`."""
  return jax.tree.map(
      lambda v, s: v.replace(jax.ShapeDtypeStruct(
          v.get_value().shape, v.get_value().dtype, sharding=s.get_value())),
      state, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))


def abstract_model(config: Any) -> nnx.Module:
  """The policy of `config` (with what `setup.attach` adds: LoRA adapters,
  a distillation projection) as shapes: what
  `setup.policy` builds, with nothing allocated."""
  cfg = blocks.architecture(config.model)
  kwargs = checkpoints.model_kwargs(config.model)

  def build():
    model = decoder.Decoder(cfg, rngs=nnx.Rngs(config.seed), **kwargs)
    setup.attach(model, config)
    return model

  return nnx.eval_shape(build)


def abstract_policy(config: Any, mesh: Any) -> nnx.Module:
  """`abstract_model`, its shapes sharded on `mesh`."""
  graphdef, state = nnx.split(abstract_model(config))
  return nnx.merge(graphdef, on_mesh(state, mesh, config.sharding))


def abstract_frozen(block: Any, mesh: Any, rules: Any) -> nnx.Module:
  """The decoder a model block names (a teacher, a frozen scorer) as
  shapes sharded on `mesh`."""
  model = nnx.eval_shape(lambda: decoder.Decoder(
      blocks.architecture(block), rngs=nnx.Rngs(0),
      **checkpoints.model_kwargs(block)))
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, on_mesh(state, mesh, rules))


def init_programs(block: Any, seed: int, mesh: Any, rules: Any) -> list[Any]:
  """The program that draws the initial parameters of the model a block
  names, compiled, when it has no checkpoint (`setup.init_program`)."""
  init = setup.init_program(block, seed=seed, mesh=mesh, rules=rules)
  return [init.lower().compile()] if init else []


def on_mesh(state: nnx.State, mesh: Any, rules: Any) -> nnx.State:
  """Abstract parameters placed on `mesh` by their logical axes."""
  return with_shardings(state, checkpoints.param_shardings(state, mesh, rules))


def batch_on(mesh: Any, rules: Any,
             shapes: dict[str, tuple[tuple[int, ...], Any]]) -> dict[str, Any]:
  """A batch as shapes, split over the mesh's batch axes like the jobs'."""
  return {k: jax.ShapeDtypeStruct(shape, dtype,
                                  sharding=sharding.batch(mesh, shape, rules))
          for k, (shape, dtype) in shapes.items()}


def train_phase(train_step: Any, state: Any, frozen: Any,
                batch: dict[str, Any], name: str = 'train step',
                role: str = 'actor', init: Any = None) -> Phase:
  """A train step (made by `train.step.make_step`) on `batch`, the check
  that its parameters are finite before a checkpoint, and the program
  `init` that draws the initial parameters (a preset's random init)."""
  return Phase(name, role, lambda: [
      train_step.func.lower(state, batch, frozen=frozen).compile(),
      loop.all_finite.lower(state.params).compile()] + (
          [init.lower().compile()] if init else []),
               resident_args=per_device((state, frozen)), timed=1)


def logps_phase(name: str, meshes: Any, mesh: Any, full_state: nnx.State,
                rules: Any, lower: Callable[[Any, nnx.State], Any]) -> Phase:
  """A forward pass of the whole model (`full_state` placed on `mesh` by
  `rules`); `lower(mesh, state)` lowers the job's program (or a list of
  them)."""
  state = on_mesh(full_state, mesh, rules)
  role = next(r for r, m in meshes.by_role.items() if m is mesh)

  def compile_all():
    lowered = lower(mesh, state)
    return [x.compile() for x in (
        lowered if isinstance(lowered, list) else [lowered])]

  return Phase(name, role, compile_all, resident_args=per_device(state))


def reference_phase(config: Any, meshes: Any, full_state: nnx.State,
                    lower: Callable[[Any, nnx.State], Any],
                    plan: Plan) -> None:
  """The frozen reference's log-probabilities on its mesh, added to
  `plan`. Unless it is a LoRA policy's own frozen base (resident already),
  its copy of the initial policy joins its role's resident state, and the
  copy's programs join the plan's transfers."""
  mesh = scoring.reference_mesh(config, meshes)
  phase = logps_phase('reference logps', meshes, mesh, full_state,
                      config.sharding, lower)
  plan.phases.append(phase)
  if not config.lora.rank:
    plan.resident.setdefault(phase.role, {})['reference'] = (
        phase.resident_args)
    plan.transfers.append(Transfer(
        'reference copy', full_state,
        on_mesh(full_state, mesh, config.sharding),
        reshard.Budget.from_block(config.runtime), ('actor', phase.role),
        per_step=0))


def generation_phase(name: str, role: str, model: nnx.Module, mesh: Any,
                     rules: Any, batch: int, prompt_length: int,
                     sampling: Any, decode_chunk: int = 0,
                     per_step: float = 1.0) -> Phase:
  """What a Sampler of `model` on `mesh` compiles to generate for `batch`
  prompts of up to `prompt_length` tokens (`Sampler.programs`), with its
  KV cache in the note."""
  engine = sampler_lib.Sampler(model, pad_id=0, eos_ids=(1,), mesh=mesh,
                               rules=rules, decode_chunk=decode_chunk)
  return Phase(name, role,
               lambda: engine.programs(batch, prompt_length, sampling),
               resident_args=per_device(nnx.state(model)),
               note=lambda: 'KV cache ' + size(engine.cache_bytes(
                   batch, prompt_length, sampling)), bounded=True,
               per_step=per_step, decode_steps=sampling.max_new_tokens)


def actor_resident(state: Any, frozen: Any) -> dict[str, int]:
  """What an actor keeps between steps: its parameters, optimizer state
  and (LoRA) the frozen base."""
  resident = {'params': per_device(state.params),
              'optimizer': per_device((state.opt_state, state.step,
                                       state.rng))}
  if frozen is not None:
    resident['frozen base'] = per_device(frozen)
  return resident


def size(n: float) -> str:
  """Bytes for people: '1.23 GiB', '45.6 MiB'."""
  if n >= topology.GIB:
    return f'{n / topology.GIB:.2f} GiB'
  return f'{n / 2**20:.1f} MiB'
