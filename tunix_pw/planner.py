"""A layout planner for an RL job on a TPU slice: which share of the chips
the rollout gets (or all of them, collocated), how wide its tensor
parallelism, how wide the actor's FSDP, in how many pipeline stages, over
how many devices a sample's tokens split (sequence parallelism), how many
samples per device in a micro batch and which remat, ranked by estimated
step time among the layouts that fit.

  python -m tunix_pw.main --config=tunix_pw/configs/grpo.py:gemma3-27b \
      --compile_topology=v5p-2048 --plan_layout [--plan_compile=5]

Every combination is first sized from the model's shapes alone: a lower
bound of each device's memory (what stays resident, the rollout's copy
held twice while a weight sync lands, its KV cache, the train step's
saved layer inputs), which drops what cannot fit, and a rough step time
(compute and HBM rooflines per phase, FSDP gathers over the torus), which
orders the rest. Only the `plan_compile` fastest are compiled (compile-only
checks with `--estimate`, minutes each for a large model): a layout whose
compiled peak exceeds the HBM is dropped, the rest are ranked by the
compiled programs' estimated step time and printed with the config
overrides that select each.
"""

from __future__ import annotations

from collections.abc import Callable
import contextlib
import copy
import dataclasses
import io
import itertools
import math
from typing import Any

from flax import nnx
import jax

from tunix_pw import compile_only, estimate, workdir as workdir_lib
from tunix_pw.errors import UsageError
from tunix_pw.models import blocks
from tunix_pw.rl import plan as plan_lib
from tunix_pw.runtime import hlo_cost, topology
from tunix_pw.train import plans

ROLLOUT_SHARES = (0.0, 0.25, 0.5, 0.75)  # 0: collocated
TP = (1, 2, 4, 8, 16)
MICRO = (1, 2, 4)  # samples per actor device per micro batch
STAGES = (1, 2, 4)  # the actor's pipeline stages, where they divide
SEQUENCE = (1, 2, 4)  # devices a sample's tokens split over, where they divide
REMAT = ('full', 'dots')
_BYTES = {'float32': 4, 'bfloat16': 2}


@dataclasses.dataclass(frozen=True)
class Layout:
  """One candidate on `chips` devices."""
  chips: int
  rollout_share: float  # of the chips; 0: every role on every chip
  tp: int  # the rollout's tensor parallel width
  fsdp: int  # the actor's (and reference's) FSDP width; data over the rest
  micro: int  # samples per actor device per micro batch (its tokens')
  remat: str
  stage: int = 1  # the actor's (and reference's) pipeline stages
  sequence: int = 1  # devices a sample's tokens split over

  @property
  def microbatches(self) -> int:
    """A pipelined pass's: a row per device in each."""
    return self.micro * self.stage

  @property
  def micro_batch(self) -> int:
    """Samples a pass: `micro` per device, a sample over `sequence`."""
    return self.micro * self.actor // self.sequence

  @property
  def actor(self) -> int:
    return self.chips - round(self.chips * self.rollout_share)

  @property
  def rollout(self) -> int:
    return round(self.chips * self.rollout_share) or self.chips

  def settings(self) -> dict[str, Any]:
    """Dotted config fields -> values."""
    if self.rollout_share:
      split = f'{round(100 * (1 - self.rollout_share))}%'
      devices = dict(layout='disaggregated', actor=f'0%:{split}',
                     rollout=f'{split}:100%')
    else:
      devices = dict(layout='collocated', actor='all', rollout='all')
    data = self.actor // (self.fsdp * self.stage * self.sequence)
    axes = f'data={data},fsdp={self.fsdp}'
    axes += f',sequence={self.sequence}' if self.sequence > 1 else ''
    axes += f',stage={self.stage}' if self.stage > 1 else ''
    return {'meshes.layout': devices['layout'],
            'meshes.actor.devices': devices['actor'],
            'meshes.actor.axes': axes, 'meshes.reference.devices': 'actor',
            'meshes.reference.axes': axes,
            'meshes.rollout.devices': devices['rollout'],
            'meshes.rollout.axes': f'data=-1,tp={self.tp}',
            'rl.micro_batch_size': self.micro_batch,
            'rl.logps_micro_batch_size': self.micro_batch,
            'model.remat': self.remat,
            **({'model.pipeline_microbatches': self.microbatches}
               if self.stage > 1 else {})}

  def overrides(self) -> str:
    return ' '.join(f'--config.{k}={v}' for k, v in self.settings().items())

  def apply(self, config: Any) -> Any:
    out = copy.deepcopy(config)
    for key, value in self.settings().items():
      *path, name = key.split('.')
      block = out
      for part in path:
        block = block[part]
      block[name] = value
    return out


def candidates(config: Any, chips: int, per_host: int) -> list[Layout]:
  """Every layout whose meshes divide the chips (whole hosts: libtpu
  compiles no mesh that splits one), the batches (a step's samples
  over the rollout's replicas too: a batch that does not divide is
  replicated, every replica decoding all of it) and the samples' tokens."""
  arch = blocks.architecture(config.model)
  rl = config.rl
  samples = rl.prompts_per_step * rl.num_generations
  repeats = arch.groups[0][1]
  length = rl.max_prompt_length + rl.max_new_tokens
  out = []
  for share in ROLLOUT_SHARES:
    base = Layout(chips, share, tp=1, fsdp=1, micro=1, remat=REMAT[0])
    actor, rollout = base.actor, base.rollout
    if actor % per_host or rollout % per_host:
      continue
    for tp in TP:
      if rollout % tp or arch.num_heads % tp or samples % (rollout // tp):
        continue
      for stage, sequence in itertools.product(STAGES, SEQUENCE):
        split = stage * sequence
        if repeats % stage or length % sequence or actor % split:
          continue
        widest = math.gcd(actor // split, arch.embed_dim)
        for fsdp in sorted({widest, max(widest // 4, 1)}):
          for micro in MICRO:
            if (micro * actor % sequence or
                rl.mini_batch_size % (micro * actor // sequence)):
              continue
            out += [dataclasses.replace(
                base, tp=tp, fsdp=fsdp, micro=micro, remat=remat,
                stage=stage, sequence=sequence) for remat in REMAT]
  return out


@dataclasses.dataclass
class Sizing:
  """A layout sized from shapes: a lower bound of a device's bytes and a
  rough step time."""
  memory: int
  seconds: float


def size(config: Any, layout: Layout, roofline: estimate.Roofline,
         params: int) -> Sizing:
  """Lower bounds: parameters, optimizer state and the reference sharded
  over the actor's FSDP, sequence and stage axes; the rollout's copy over
  its tp, twice while a sync lands; its KV cache for its share of a step's
  samples; the train step's saved layer inputs (every remat keeps them;
  what else a remat policy saves, XLA may still recompute), a pipeline's
  bubble ticks' too. The time: each phase's compute or HBM traffic at the
  chip's peak, whichever is longer, the train step's FSDP gathers
  (forward, backward and a remat's second forward: a pipeline's stage
  gathers its layers at every tick), a split sequence's key and value
  gathers (each layer's, as often) and gradient reduce-scatter at the
  ICI's; a pipeline's passes take (M + S - 1) / M of their compute."""
  arch = blocks.architecture(config.model)
  rl = config.rl
  stored = _BYTES[config.model.param_dtype]
  compute = _BYTES[config.model.dtype]
  state = _BYTES[config.optimizer.get('state_dtype') or
                 config.model.param_dtype]
  samples = rl.prompts_per_step * rl.num_generations
  length = rl.max_prompt_length + rl.max_new_tokens
  reference = 'reference' in config.meshes
  sharded = layout.fsdp * layout.stage * layout.sequence
  ticks = (layout.microbatches + layout.stage - 1) / layout.microbatches
  actor = params * (stored * (1 + reference) + 2 * state) // sharded
  actor += int(layout.micro * length * arch.embed_dim * arch.num_layers *
               compute * ticks / layout.sequence)
  kv = (2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * compute *
        length // min(layout.tp, arch.num_kv_heads))
  replicas = layout.rollout // layout.tp
  rollout = 2 * params * stored // layout.tp + kv * -(-samples // replicas)
  memory = actor + rollout if not layout.rollout_share else max(actor,
                                                                 rollout)

  flops_per_token = 2 * params
  tokens = samples * length
  forwards = (3 if layout.remat == 'full' else 2) * (
      samples // layout.micro_batch)  # passes, a backward's counted
  gathers = forwards * (
      1 if layout.stage == 1 else layout.microbatches + layout.stage - 1)
  network = sum(times * roofline.network_seconds(hlo_cost.Collective(
      kind, params * stored // layout.stage, layout.fsdp * layout.sequence))
                for kind, times in (('all-gather', gathers),
                                    ('reduce-scatter', 1)))
  # A split sequence's keys and values, every layer's whole, each pass.
  network += forwards * roofline.network_seconds(hlo_cost.Collective(
      'all-gather', layout.micro * 2 * arch.num_layers * arch.num_kv_heads *
      arch.head_dim * compute * length, layout.sequence))
  train = max(network, (4 if layout.remat == 'full' else 3) * ticks *
              flops_per_token * tokens / layout.actor / roofline.flops)
  scoring = (plan_lib.logps_calls(config) and (
      1 + reference)) * ticks * flops_per_token * tokens / layout.actor / (
          roofline.flops)
  prefill = flops_per_token * samples * rl.max_prompt_length / (
      layout.rollout * roofline.flops)
  decode = rl.max_new_tokens * (params * stored / layout.tp + kv * -(
      -samples // replicas)) / roofline.hbm
  return Sizing(memory, train * plan_lib.total_updates(config) / config.steps
                + scoring + prefill + decode)


def plan(config: Any, job: Any, tpu_type: str, num_slices: int,
         workdir: str | None, backend_name: str,
         validate: Callable[[Any], Any], to_compile: int = 5) -> list[dict]:
  """Sizes every candidate, compiles the `to_compile` fastest that may fit
  (`validate(config)` first: the job's own checks), prints the ranking of
  those that fit and writes it to `workdir`'s layout_plan.json. Raises
  UsageError when none fits."""
  if set(config.meshes) - {'layout'} != {'actor', 'reference', 'rollout'}:
    raise UsageError(
        '--plan_layout plans jobs whose meshes are actor, reference and '
        f'rollout (GRPO and its variants); the {config.job} job has '
        f'{", ".join(sorted(set(config.meshes) - {"layout"}))}.')
  tpu = topology.parse(tpu_type, '--compile_topology')
  devices = topology.devices(tpu, num_slices)
  chips = len(devices)
  layouts = candidates(config, chips, chips // len(
      {d.process_index for d in devices}))
  roofline = estimate.Roofline.of(tpu)
  hbm = tpu.hbm_bytes
  params = sum(x.size for x in jax.tree.leaves(nnx.state(
      plans.abstract_model(config))))
  sized = []
  for layout in layouts:
    s = size(config, layout, roofline, params)
    if s.memory <= hbm:
      try:
        validate(layout.apply(config))
      except UsageError:
        continue
      sized.append((s.seconds, layout, s))
  sized.sort(key=lambda t: t[0])
  total = len(layouts)
  chosen = _spread(sized, to_compile)
  print(f'{total} layouts; {len(sized)} may fit {num_slices} x {tpu.name} '
        f'by their shapes; compiling {len(chosen)}, the fastest by a rough '
        "estimate for each rollout placement", flush=True)
  results = []
  for i, (_, layout, s) in enumerate(chosen):
    print(f'[{i + 1}/{len(chosen)}] {layout.overrides()}', flush=True)
    log = io.StringIO()
    try:
      with contextlib.redirect_stdout(log):
        report = compile_only.report(layout.apply(config), job, tpu_type,
                                     num_slices, backend_name, True)
    except UsageError as e:
      print(f'  skipped: {e}', flush=True)
      continue
    step = report['estimate']['step']
    results.append(dict(
        overrides=layout.overrides(), fits=report['fits'],
        peak=report['peak_per_device'], hbm=report['hbm_per_device'],
        step_s=step['seconds'], tokens_per_s=step['tokens_per_s'],
        mfu=step['mfu'], rough_s=s.seconds, rough_memory=s.memory,
        longest=_longest(report['estimate']['phases']),
        compile_s=report['compile_seconds']))
    print(f'  peak {report["peak_per_device"] / 2**30:.2f} of '
          f'{report["hbm_per_device"] / 2**30:.1f} GiB'
          f'{"" if report["fits"] else " (does not fit)"}, est. step '
          f'{step["seconds"]:.3g} s ({report["compile_seconds"]:.0f} s to '
          'compile)', flush=True)
  fitting = sorted((r for r in results if r['fits']),
                   key=lambda r: r['step_s'])
  print(table(fitting), flush=True)
  if workdir:
    workdir_lib.write_json(workdir, workdir_lib.LAYOUT_PLAN, dict(
        tpu_type=tpu.name, num_slices=num_slices, candidates=total,
        sized=len(sized), compiled=results, ranked=fitting))
  if not fitting:
    raise UsageError(
        f'no layout of the {config.job} job fits {num_slices} x {tpu.name}: '
        f'{len(sized)} of {total} might by their shapes and the '
        f'{len(results)} compiled do not; use more chips, shorter '
        'sequences or fewer samples per step.')
  return fitting


def _spread(sized: list[tuple[float, Layout, Sizing]],
            count: int) -> list[tuple[float, Layout, Sizing]]:
  """The `count` fastest, no two with the same rollout share and tp (the
  placement, which the rough estimate weighs best) while others remain."""
  first, rest, seen = [], [], set()
  for item in sized:
    key = (item[1].rollout_share, item[1].tp)
    (rest if key in seen else first).append(item)
    seen.add(key)
  return sorted((first + rest)[:count], key=lambda t: t[0])


def _longest(phases: list[dict[str, Any]]) -> str:
  p = max(phases, key=lambda p: p['seconds'] * p['per_step'])
  return f'{p["name"]} ({p["bound"]})'


def table(ranked: list[dict[str, Any]]) -> str:
  lines = ['| rank | est. step s | tokens/s | MFU | peak HBM GiB | longest '
           'phase (bound) | overrides |', '|' + ' --- |' * 7]
  lines += [f'| {i + 1} | {r["step_s"]:.3g} | {r["tokens_per_s"]:,.0f} | '
            f'{r["mfu"]:.1%} | {r["peak"] / 2**30:.2f} of '
            f'{r["hbm"] / 2**30:.1f} | {r["longest"]} | `{r["overrides"]}` |'
            for i, r in enumerate(ranked)]
  return '\n'.join(lines)
