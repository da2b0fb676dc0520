"""Your own algorithms, registered where tunix_pw looks them up: import
this module from your config file (docs/extending.md). Each registration
makes a name that `--config.*` fields accept."""

import dataclasses

import jax
import jax.numpy as jnp

from tunix_pw import registry
from tunix_pw.agents import calls, envs, tools
from tunix_pw.train import losses, preference


def hinge(pair: losses.Pair, beta: float, lam: float) -> jax.Array:
  """A hinge on the implicit reward margin (SLiC-HF, Zhao et al. 2023,
  arXiv 2305.10425): max(0, 1 - beta * margin) per pair."""
  del lam
  return jax.nn.relu(1.0 - beta * losses.margin(pair))


# --config.dpo.algorithm=hinge: pairs, a reference, this loss.
registry.register('preference_loss', 'hinge')(
    preference.Preference(preference.PAIRED, preference.paired(hinge)))


@registry.register('advantage', 'median_baseline')
def median_baseline(rewards: jax.Array) -> jax.Array:
  """--config.rl.advantage=median_baseline: each reward [prompts,
  generations] minus its group's median."""
  return rewards - jnp.median(rewards, axis=1, keepdims=True)


# --config.rl.advantage=teacher_favoured with grpo.py's distill variant:
# on-policy distillation's token advantage log pi_T - log pi_S, kept only
# where the teacher favours the sampled token more than the student does,
# so the student is pulled towards the teacher's choices and never pushed
# off its own.
registry.register('advantage', 'teacher_favoured')(dataclasses.replace(
    registry.get('advantage', 'on_policy_distill'),
    of_logps=lambda teacher, student: jax.nn.relu(teacher - student)))


@registry.register('reward', 'short_answer')
def short_answer(sample) -> float:
  """--config.rl.rewards=short_answer:0.1: 1 for a completion of at most
  eight words (`sample` is an rl.rewards.Sample)."""
  return float(len(sample.completion.split()) <= 8)


@tools.tool
def add(a: int, b: int) -> str:
  """Adds two integers."""
  return str(a + b)


@envs.environment('adder')
def adder(agent, tokenizer, executor) -> envs.Task:
  """--config.agent.env=adder with --config.agent.tools=add: addition
  problems ('48213+91725='), answered with the `add` tool; the
  demonstration (SFT warm-up data) calls it on the two operands."""
  toolbox = tools.get(agent.tools)
  opening, template_vars = calls.tool_context(tokenizer, toolbox,
                                              agent.call_format)

  def demonstration(example) -> list[str]:
    a, b = (int(x) for x in example['question'].rstrip('=').split('+'))
    call = calls.Call('add', dict(a=a, b=b))
    return [calls.render(agent.call_format, call), add(a, b)]

  return envs.Task(lambda: envs.ToolEnv(
      toolbox, agent.call_format, agent.max_turns, agent.tool_timeout,
      executor, opening, agent.malformed_reward), template_vars,
                   demonstration)
