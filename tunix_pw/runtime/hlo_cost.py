"""What a compiled program does per device, read from its optimized HLO:
matrix FLOPs, HBM bytes and collectives, with every loop counted as many
times as it runs.

XLA's own `cost_analysis()` counts a while loop's body once, whatever its
trip count: a model whose layers run as a scan of 62 repeats shows one
layer's FLOPs. Here each loop with a known trip count (XLA's, or a
condition `counter < bound` on a counter started from a constant: a scan,
a fori loop) is multiplied out; a loop without one (a decode loop that may
stop early) counts once, its body in `loops` for the caller to scale.

The model, per instruction:
- FLOPs: 2 x output elements x contracted size for `dot` and
  `convolution` (matrix units' work; elementwise work is left out: it is
  small next to it and runs on other units).
- HBM bytes: outputs plus operands of each instruction outside fusions
  (a fusion reads its operands and writes its outputs once); an operand a
  fusion only slices counts as the slices it reads, an in-place update
  counts the update (a scanned layer reads its own weights, not the stack).
- Collectives: kind, bytes (the whole buffer per device: all-gather's
  output, reduce-scatter's input, the others' operand) and group size.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Any

DTYPE_BYTES = {'pred': 1, 's8': 1, 'u8': 1, 's16': 2, 'u16': 2, 'f16': 2,
               'bf16': 2, 's32': 4, 'u32': 4, 'f32': 4, 's64': 8, 'u64': 8,
               'f64': 8, 'c64': 8, 'c128': 16, 's4': 0.5, 'u4': 0.5,
               'f8e4m3fn': 1, 'f8e5m2': 1, 'token': 0}
COLLECTIVES = ('all-gather', 'all-reduce', 'reduce-scatter', 'all-to-all',
               'collective-permute')
# Instructions that move no data of their own.
_FREE = {'parameter', 'constant', 'tuple', 'get-tuple-element', 'bitcast',
         'while', 'call', 'conditional', 'after-all', 'partition-id',
         'replica-id', 'add-dependency', 'opt-barrier', 'copy-done',
         'send-done', 'recv-done', 'all-gather-done', 'all-reduce-done',
         'collective-permute-done', 'async-done', 'async-update'}
_SLICES = {'dynamic-slice', 'slice', 'gather'}

_ARRAY = re.compile(r'\b([a-z]+\d*(?:e\dm\d(?:fn)?)?)\[([\d,]*)\]')
_HEADER = re.compile(r'^(?:ENTRY )?%?([\w.\-]+) \((.*)\) -> .* \{$')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = (.*)$')


@dataclasses.dataclass(frozen=True)
class Collective:
  kind: str
  bytes: float  # per device, the whole buffer
  group: int  # devices taking part


@dataclasses.dataclass
class Cost:
  flops: float = 0.0
  hbm_bytes: float = 0.0
  collectives: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)  # Collective -> times run
  # The bodies of loops without a trip count, each counted once above.
  loops: list['Cost'] = dataclasses.field(default_factory=list)

  def add(self, other: 'Cost', times: float = 1) -> None:
    self.flops += other.flops * times
    self.hbm_bytes += other.hbm_bytes * times
    for c, n in other.collectives.items():
      self.collectives[c] += n * times
    self.loops += other.loops


def shape_bytes(shape: str) -> float:
  """Bytes of an HLO shape (an array or a tuple of them)."""
  return sum(DTYPE_BYTES.get(dtype, 4) * math.prod(
      int(d) for d in dims.split(',') if d) for dtype, dims in
             _ARRAY.findall(_strip_layouts(shape)))


def _strip_layouts(shape: str) -> str:
  return re.sub(r'\{[^{}]*\}', '', shape)


def _dims(shape: str) -> list[int]:
  match = _ARRAY.search(shape)
  return [int(d) for d in match.group(2).split(',') if d] if match else []


def _closing(text: str, start: int) -> int:
  """The index just past the bracket that closes text[start]."""
  depth, pairs = 0, {'(': ')', '{': '}', '[': ']'}
  opening = text[start]
  for i in range(start, len(text)):
    if text[i] == opening:
      depth += 1
    elif text[i] == pairs[opening]:
      depth -= 1
      if not depth:
        return i + 1
  return len(text)


@dataclasses.dataclass
class _Instruction:
  name: str
  shape: str
  op: str
  operands: list[str]
  attrs: str
  attrs_in: str  # the text inside the operand parentheses


def _parse_instruction(name: str, rest: str) -> _Instruction:
  if rest.startswith('('):
    end = _closing(rest, 0)
  else:
    end = rest.index(' ')
  shape, rest = rest[:end], rest[end:].lstrip()
  op_end = rest.index('(')
  op = rest[:op_end]
  args_end = _closing(rest, op_end)
  operands = re.findall(r'%([\w.\-]+)', rest[op_end:args_end])
  return _Instruction(name, shape, op, operands, rest[args_end:],
                      rest[op_end:args_end])


def _computations(text: str) -> tuple[Any, Any, Any, str]:
  """Each computation's instructions, value shapes by name (parameters
  included) and parameter names in order; the entry computation's name."""
  bodies, shapes, params, entry, current = {}, {}, {}, '', None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header:
      current = header.group(1)
      bodies[current], shapes[current], params[current] = [], {}, []
      if line.startswith('ENTRY'):
        entry = current
      for param in re.finditer(r'([\w.\-]+): ', header.group(2)):
        start = param.end()
        end = (_closing(header.group(2), start)
               if header.group(2)[start] == '(' else
               re.search(r'(,\s|$)', header.group(2)[start:]).start() + start)
        shapes[current][param.group(1)] = header.group(2)[start:end]
        params[current].append(param.group(1))
      continue
    if current is None:
      continue
    if line.startswith('}'):
      current = None
      continue
    match = _INSTRUCTION.match(line)
    if match:
      instruction = _parse_instruction(match.group(1), match.group(2))
      bodies[current].append(instruction)
      shapes[current][instruction.name] = instruction.shape
  return bodies, shapes, params, entry


def _group_size(attrs: str) -> int:
  """Devices per replica group, from any of HLO's three spellings."""
  match = re.search(r'replica_groups=\[([\d,]+)\]<=', attrs)
  if match:
    return int(match.group(1).split(',')[-1])
  match = re.search(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}", attrs)
  if match:
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", match.group(1)))
    return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'",
                                                          match.group(2)))
  match = re.search(r'replica_groups=\{\{([\d,]*)\}', attrs)
  if match:
    return len(match.group(1).split(','))
  match = re.search(r'source_target_pairs=\{(.*?)\}\}', attrs)
  return 2 if match else 1


class _Program:

  def __init__(self, text: str):
    self.bodies, self.shapes, self.params, self.entry = _computations(text)
    self.named = {name: {i.name: i for i in body}
                  for name, body in self.bodies.items()}
    self._memo: dict[tuple[str, bool], Cost] = {}
    self._reads: dict[str, Any] = {}

  def cost(self, name: str, fused: bool = False) -> Cost:
    key = (name, fused)
    if key not in self._memo:
      total = Cost()
      for instruction in self.bodies.get(name, []):
        total.add(self._instruction(name, instruction, fused))
      self._memo[key] = total
    return self._memo[key]

  def _instruction(self, computation: str, ins: _Instruction,
                   fused: bool) -> Cost:
    cost = Cost()
    shapes = self.shapes[computation]
    operand = lambda i: shapes.get(ins.operands[i], '')
    if ins.op == 'dot':
      contracting = re.search(r'lhs_contracting_dims=\{([\d,]*)\}', ins.attrs)
      lhs = _dims(operand(0))
      size = math.prod(lhs[int(d)] for d in contracting.group(1).split(',')
                       if d) if contracting else 1
      cost.flops = 2 * math.prod(_dims(ins.shape)) * size
    elif ins.op == 'convolution':
      cost.flops = _convolution_flops(ins, _dims(operand(0)))
    called = re.findall(r'(?:calls|body|condition)=%([\w.\-]+)', ins.attrs)
    if ins.op == 'while':
      trips = self._trips(computation, ins)
      body = Cost()
      for name in called:
        body.add(self.cost(name, fused))
      cost.add(body, trips or 1)
      if not trips:
        cost.loops.append(body)
    elif ins.op == 'conditional':
      branches = re.findall(r'%([\w.\-]+)', re.search(
          r'branch_computations=\{([^}]*)\}', ins.attrs).group(1)) \
          if 'branch_computations' in ins.attrs else called
      costs = [self.cost(b, fused) for b in branches]
      if costs:  # the dearest branch
        cost.add(max(costs, key=lambda c: (c.flops, c.hbm_bytes)))
    else:
      for name in called:  # a fusion's insides; a call's or async's body
        cost.add(self.cost(name, fused or ins.op == 'fusion'))
    kind = ins.op.removesuffix('-start')
    if kind in COLLECTIVES:
      size = (shape_bytes(operand(0)) if kind == 'reduce-scatter'
              else _output_bytes(ins))
      cost.collectives[Collective(kind, size, _group_size(ins.attrs))] += 1
    if not fused and ins.op not in _FREE:
      cost.hbm_bytes += self._moved(computation, ins)
    return cost

  def _trips(self, computation: str, loop: _Instruction) -> int | None:
    """A while loop's trip count: XLA's `known_trip_count`, else read off
    a condition `counter < bound` (or <=) on a counter the loop starts
    from a constant and its body adds a constant to (as TPU compilations
    leave a scan)."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attrs)
    if known:
      return int(known.group(1))
    condition = re.search(r'condition=%([\w.\-]+)', loop.attrs).group(1)
    body = self.named.get(condition, {})
    root = self.bodies[condition][-1] if body else None
    direction = re.search(r'direction=(LT|LE)', root.attrs) if (
        root is not None and root.op == 'compare') else None
    if not direction:
      return None
    counter, bound = (body.get(o) for o in root.operands)
    if not (counter and bound and counter.op == 'get-tuple-element' and
            bound.op == 'constant'):
      return None
    index = int(re.search(r'index=(\d+)', counter.attrs).group(1))
    start = 0
    callers = self.named[computation]
    initial = callers.get(loop.operands[0]) if loop.operands else None
    if initial is not None and initial.op == 'tuple':
      first = callers.get(initial.operands[index])
      if first is not None and first.op == 'constant':
        start = _constant(first)
    step = self._increment(
        re.search(r'body=%([\w.\-]+)', loop.attrs).group(1), index)
    trips = -(-(_constant(bound) - start + (direction.group(1) == 'LE'))
              // step)
    return trips if trips > 0 else None

  def _increment(self, body: str, index: int) -> int:
    """What a loop body adds to its counter (tuple element `index`) each
    time: 1, or more where XLA unrolled the body (a windowed einsum
    doing two shards a turn)."""
    named = self.named.get(body, {})
    root = self.bodies[body][-1] if named else None
    if root is None or root.op != 'tuple' or index >= len(root.operands):
      return 1
    update = named.get(root.operands[index])
    if update is None or update.op != 'add':
      return 1
    for operand in update.operands:
      value = named.get(operand)
      if value is not None and value.op == 'constant':
        return max(_constant(value), 1)
    return 1

  def _moved(self, computation: str, ins: _Instruction) -> float:
    """HBM bytes an instruction outside fusions reads and writes."""
    shapes = self.shapes[computation]
    if ins.op in _SLICES:
      return 2 * _output_bytes(ins)
    if ins.op == 'dynamic-update-slice':
      return 2 * shape_bytes(shapes.get(ins.operands[1], ''))
    if ins.op != 'fusion':
      return _output_bytes(ins) + sum(shape_bytes(shapes.get(o, ''))
                                      for o in ins.operands)
    inside = re.search(r'calls=%([\w.\-]+)', ins.attrs).group(1)
    reads, written = self._fusion_reads(inside)
    return written + sum(
        reads.get(i, shape_bytes(shapes.get(o, '')))
        for i, o in enumerate(ins.operands))

  def _fusion_reads(self, name: str) -> tuple[dict[int, float], float]:
    """Per parameter number, the bytes a fused computation reads of it
    when that is less than the whole (only slices of it, here or in a
    fusion nested inside; or it is the buffer an in-place update writes
    into); and the bytes it writes (an in-place update: the update)."""
    if name in self._reads:
      return self._reads[name]
    body = self.bodies[name]
    order = {p: i for i, p in enumerate(self.params[name])}
    for ins in body:  # parameters spelled out as instructions
      if ins.op == 'parameter':
        order[ins.name] = int(re.match(r'\((\d+)', ins.attrs_in).group(1))
    users = collections.defaultdict(list)
    for ins in body:
      for o in ins.operands:
        users[o].append(ins)
    named = self.named[name]
    root = body[-1]
    outputs = ([named[o] for o in root.operands] if root.op == 'tuple'
               else [root])
    written, updates = 0.0, []
    for out in outputs:  # in-place updates (through bitcasts) write less
      while out.op == 'bitcast' and out.operands[0] in named:
        out = named[out.operands[0]]
      if out.op == 'dynamic-update-slice':
        updates.append(out)
        written += shape_bytes(self.shapes[name].get(out.operands[1], ''))
      else:
        written += _output_bytes(out)

    def partial(value: str) -> float | None:
      total = 0.0
      for use in users[value]:
        if use.op in _SLICES and use.operands[0] == value:
          total += _output_bytes(use)
        elif use.op == 'bitcast':
          inner = partial(use.name)
          if inner is None:
            return None
          total += inner
        elif use.op == 'fusion':
          inner = self._fusion_reads(re.search(
              r'calls=%([\w.\-]+)', use.attrs).group(1))[0].get(
                  use.operands.index(value))
          if inner is None:
            return None
          total += inner
        elif any(use is u for u in updates) and use.operands[0] == value:
          continue  # written in place, not read
        else:
          return None
      return total if users[value] else None

    reads = {number: read for param, number in order.items()
             if (read := partial(param)) is not None}
    self._reads[name] = reads, written
    return reads, written


def _convolution_flops(ins: _Instruction, lhs: list[int]) -> float:
  """2 x output batch x output features x input features per group x the
  window taps that land on input elements, summed over output positions
  (TPU programs spell a batched matrix product as a convolution whose
  window is mostly padding or dilation holes: those taps do no work)."""
  labels = re.search(r'dim_labels=(\w+)_(\w+)->(\w+)', ins.attrs)
  lhs_labels, _, out_labels = labels.groups()
  out = _dims(ins.shape)
  spatial = [c for c in out_labels if c.isdigit()]
  window = {}
  field = re.search(r'window=\{([^}]*)\}', ins.attrs)
  for item in (field.group(1).split() if field else []):
    key, value = item.split('=')
    window[key] = value.split('x')
  taps = 1
  for d, label in enumerate(spatial):
    get = lambda key, default, d=d: (int(window[key][d].split('_')[0])
                                     if key in window else default)
    size, stride = get('size', 1), get('stride', 1)
    pad = int(window['pad'][d].split('_')[0]) if 'pad' in window else 0
    lhs_dilate, rhs_dilate = get('lhs_dilate', 1), get('rhs_dilate', 1)
    extent = (lhs[lhs_labels.index(label)] - 1) * lhs_dilate + 1
    taps *= sum(1 for o in range(out[out_labels.index(label)])
                for k in range(size)
                if 0 <= (p := o * stride + k * rhs_dilate - pad) < extent
                and p % lhs_dilate == 0)
  groups = re.search(r'feature_group_count=(\d+)', ins.attrs)
  features = lhs[lhs_labels.index('f')] / (int(groups.group(1)) if groups
                                            else 1)
  return (2 * out[out_labels.index('b')] * out[out_labels.index('f')] *
          features * taps)


def _constant(ins: _Instruction) -> int:
  return int(re.match(r'\((-?\d+)', ins.attrs_in).group(1))


def _output_bytes(ins: _Instruction) -> float:
  return shape_bytes(ins.shape)


def analyze(hlo_text: str) -> Cost:
  """The per-device cost of a compiled program's HLO
  (`compiled.as_text()`)."""
  program = _Program(hlo_text)
  return program.cost(program.entry)


def of(compiled) -> Cost:
  return analyze(compiled.as_text())

