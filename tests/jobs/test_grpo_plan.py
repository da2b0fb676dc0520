"""One program plan serves the GRPO run and its compile-only check: the
programs `compile_plan` lowers from shapes are the ones the run compiles
from arrays (same HLO, shapes and shardings), and the runtime block sizes
the run's real weight sync."""

from flax import nnx
import jax
import numpy as np
import pytest

from tunix_pw.configs import grpo as grpo_config
from tunix_pw.models import tokenizers
from tunix_pw.rl import batch as batch_lib, phases, plan as rl_plan, trainer
from tunix_pw.runtime import backend, meshes

RUNTIME = backend.Runtime(backend.LOCAL, 'test', 0, 1, tuple(jax.devices()))


def config(**runtime):
  c = grpo_config.get_config('runlocal')
  # Reference and old log-probabilities, truncated importance weights.
  c.rl.update(kl_beta=0.04, mini_batch_size=32, tis_cap=2.0)
  c.runtime.update(**runtime)
  return c


def run_batch(c, ran):
  """The arrays of a rollout of random groups, and the first mini-batch
  the run's update phase passes to the train step."""
  rl, rng = c.rl, np.random.default_rng(0)
  groups = [batch_lib.Group(
      list(rng.integers(4, 100, 7)), '1', [list(rng.integers(4, 100, 5))
                                           for _ in range(rl.num_generations)],
      [False] * rl.num_generations, rng.random(rl.num_generations), {},
      [list(rng.random(5)) for _ in range(rl.num_generations)])
            for _ in range(rl.prompts_per_step)]
  arrays = phases.training_arrays(
      phases.Rollout(groups, [1.0] * len(groups), {}), rl,
      rl.max_prompt_length + rl.max_new_tokens, 0)
  logps = {k: np.zeros((len(arrays['tokens']), arrays['tokens'].shape[1] - 1),
                       np.float32) for k in ran.needed}
  mesh, seen = ran.policy.mesh, []
  step = lambda state, mini: (seen.append(mini), ({}, {'weight': 1.0}))[1]
  phases.update(None, step,
                phases.on_mesh({**arrays, **logps}, mesh, c.sharding), rl,
                mesh, c.sharding)
  return arrays, seen[0]


def signature(tree):
  return jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), tree)


def test_compile_plan_lowers_what_the_run_compiles():
  c = config()
  role_meshes = meshes.build(c.meshes, RUNTIME.devices)
  ran = rl_plan.plan(c, role_meshes, abstract=False)
  checked = rl_plan.plan(c, role_meshes, abstract=True)
  assert checked.needed == ran.needed == ('ref_logps', 'old_logps',
                                          'is_weights')
  arrays, batch = run_batch(c, ran)
  shapes = rl_plan.batch_shapes(c, c.rl.mini_batch_size, checked.policy.mesh,
                             token_names=checked.needed)
  assert signature(shapes) == signature(batch)
  assert signature(checked.policy.state) == signature(ran.policy.state)

  def lowered(p, state, rows):
    return p.policy.train_step.func.lower(state, rows,
                                          frozen=p.policy.frozen).as_text()

  assert lowered(checked, checked.policy.state, shapes) == lowered(
      ran, ran.policy.state, batch)
  # The log-probability program, on rows as phases.chunked_logps cuts them.
  actor, size = ran.policy.mesh, c.rl.logps_micro_batch_size
  rows = phases.on_mesh({k: arrays[k][:size] for k in phases.SEQUENCES}, actor,
                        c.sharding)
  assert checked.logps(actor).lower(
      nnx.state(checked.policy.model()),
      rl_plan.batch_shapes(c, size, actor, phases.SEQUENCES)).as_text() == (
          ran.logps(actor).lower(nnx.state(ran.policy.model()),
                                 rows).as_text())
  assert checked.rollout_shardings == ran.rollout_shardings


@pytest.mark.parametrize('mib, groups', [(256, 1), (1, 4)])
def test_reshard_group_mib_sizes_the_real_weight_sync(mib, groups):
  c = config(reshard_group_mib=mib)
  role_meshes = meshes.build(c.meshes, RUNTIME.devices)
  programs = rl_plan.plan(c, role_meshes, abstract=False)
  engine = trainer.rollout_engine(c, programs, tokenizers.load('char'),
                               role_meshes, RUNTIME)
  engine.update_weights(programs.policy.params)
  assert engine.last_sync.bytes > 3 << 20  # tiny-gemma: 3.7 MiB
  assert engine.last_sync.groups >= groups
  assert (engine.last_sync.groups == 1) == (mib == 256)


def test_a_rollout_prefills_each_prompt_once():
  """The engine gets each prompt once with `generations` (one prefill per
  prompt, the same tokens as the prompt repeated: tests/sampling), and the
  groups get every generation."""
  c = config()
  role_meshes = meshes.build(c.meshes, RUNTIME.devices)
  programs = rl_plan.plan(c, role_meshes, abstract=False)
  tokenizer = tokenizers.load('char')
  engine = trainer.rollout_engine(c, programs, tokenizer, role_meshes, RUNTIME)
  calls, generate = [], engine.generate
  engine.generate = lambda prompts, sampling: (
      calls.append((len(prompts), sampling.generations)),
      generate(prompts, sampling))[1]
  prompts = [dict(prompt=[5 + i, 6, 7], answer='1')
             for i in range(c.rl.prompts_per_step)]
  result = phases.rollout(engine, iter([prompts]), tokenizer, c.rl,
                          {'': [('digits', 1.0)]}, seed=0, step=0)()
  assert calls == [(c.rl.prompts_per_step, c.rl.num_generations)]
  assert [len(g.completions) for g in result.groups] == (
      [c.rl.num_generations] * c.rl.prompts_per_step)
