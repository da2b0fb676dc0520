"""The step-time estimate: the chip's roofline, a generation split into
prefill and decode, the step's sum (its TPU figures through main:
tests/test_compile_only.py)."""

from flax import nnx
import jax
import numpy as np
import pytest

from tunix_pw import estimate
from tunix_pw.configs import common
from tunix_pw.models import decoder, presets
from tunix_pw.runtime import hlo_cost, topology
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.train import plans


def test_collectives_ride_the_links_of_the_axes_they_span():
  chip = estimate.Roofline.of(topology.parse('v5p-512'))  # 4 x 8 x 8 chips
  assert (chip.flops, chip.hbm, chip.ici) == (459e12, 2765e9, 600e9)
  gib = 2.0 ** 30
  # 256 chips span all three axes: 600 GB/s; a ring all-reduce sends
  # twice (n-1)/n of the buffer.
  every = hlo_cost.Collective('all-reduce', gib, 256)
  assert chip.network_seconds(every) == pytest.approx(
      gib * 2 * 255 / 256 / 600e9)
  # 8 chips: one axis, a third of the links.
  one_axis = hlo_cost.Collective('all-gather', gib, 8)
  assert chip.network_seconds(one_axis) == pytest.approx(
      gib * 7 / 8 / 200e9)
  assert chip.network_seconds(hlo_cost.Collective('all-gather', gib, 1)) == 0


def test_a_generation_is_its_prefill_and_its_decode_steps():
  model = decoder.Decoder(presets.PRESETS['tiny-gemma'], rngs=nnx.Rngs(0))
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('fsdp',))
  sampling = SamplingConfig(max_new_tokens=24)
  phase = plans.generation_phase('rollout', 'rollout', model, mesh,
                                 common.sharding(), 4, 8, sampling,
                                 per_step=2)
  programs = phase.compile()
  chip = estimate.Roofline(1e12, 1e11, 1e10, (1,))
  prefill, decode = estimate.rows(phase, programs, chip, devices=1)
  assert (prefill.name, decode.name) == ('rollout prefill', 'rollout decode')
  cost = hlo_cost.of(programs[0])
  loop, = cost.loops
  # The program counts one decode step; the estimate all 24.
  assert prefill.flops == pytest.approx(cost.flops - loop.flops)
  assert decode.flops == pytest.approx(24 * loop.flops)
  assert decode.hbm_bytes == pytest.approx(24 * loop.hbm_bytes)
  per_step = chip.seconds(loop)
  assert decode.seconds == pytest.approx(24 * max(per_step.values()))
  assert decode.bound == max(per_step, key=per_step.get)
  total = estimate.step([prefill, decode], chip, chips=1, tokens=1000)
  assert total['seconds'] == pytest.approx(
      2 * (prefill.seconds + decode.seconds))
  assert total['tokens_per_s'] == pytest.approx(1000 / total['seconds'])
  assert total['mfu'] == pytest.approx(
      2 * (prefill.flops + decode.flops) / 1e12 / total['seconds'])


def test_phases_outside_a_step_are_shown_but_not_counted():
  rows = [estimate.Row('train step', 'actor', 2, 1.0, 'compute', 1e12, 0, 4),
          estimate.Row('evaluation', 'rollout', 0, 5.0, 'hbm', 1e12, 0, 4)]
  chip = estimate.Roofline(1e12, 1e11, 1e10, (2, 2))
  total = estimate.step(rows, chip, chips=8, tokens=100)
  assert total['seconds'] == 2.0
  assert total['mfu'] == pytest.approx(2 * 4e12 / (8e12 * 2))
  text = estimate.report(rows, total)
  assert '100% of the step' in text and '(not in a step)' in text
