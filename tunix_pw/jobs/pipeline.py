"""Pipeline: jobs run one after another in one runtime (e.g. SFT warm-up,
then GRPO), each in <workdir>/<stage> with its own meshes; a stage without
a checkpoint of its own starts from the previous stage's result. Prints
each stage's held-out accuracy and plots the RL stage's reward and accuracy
per step to <workdir>/progress.png."""

from __future__ import annotations

from typing import Any

from etils import epath

from tunix_pw import jobs
from tunix_pw import workdir as workdir_lib
from tunix_pw.errors import UsageError
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.preemption import Preemption
from tunix_pw.train import metrics


def validate(config: Any) -> None:
  if not config.stages:
    raise UsageError('--config.stages names no stage.')
  for name in config.stages:
    if name not in config:
      raise UsageError(f'--config.stages names {name!r}, which has no '
                       'config block.')
    stage = config[name]
    meshes_lib.check(stage.meshes, f'--config.{name}.meshes')
    jobs.get(stage.job).validate(stage)


def final_eval(workdir: str) -> dict[str, float] | None:
  evals = [m for m in metrics.read(workdir) if 'eval/accuracy' in m]
  return evals[-1] if evals else None


def plot(workdir: str, stage: str) -> str:
  """Reward and held-out accuracy per step of an RL stage, as a PNG."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  logged = metrics.read(workdir_lib.path(workdir, stage))
  train = [m for m in logged if 'reward_mean' in m]
  evals = [m for m in logged if 'eval/accuracy' in m]
  figure, axis = pyplot.subplots(figsize=(7, 4))
  axis.plot([m['step'] for m in train], [m['reward_mean'] for m in train],
            label='reward (mean)')
  axis.plot([m['step'] for m in train], [m.get('accuracy', 0) for m in train],
            label='rollout accuracy')
  axis.plot([m['step'] for m in evals], [m['eval/accuracy'] for m in evals],
            'o-', label='held-out greedy accuracy')
  axis.set_xlabel(f'{stage} step')
  axis.set_ylim(0, 1.05)
  axis.legend()
  axis.grid(alpha=0.3)
  path = workdir_lib.path(workdir, workdir_lib.PROGRESS)
  with epath.Path(path).open('wb') as f:
    figure.savefig(f, format='png', dpi=100, bbox_inches='tight')
  return path


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  del meshes  # each stage builds its own
  previous = ''
  summary = []
  for name in config.stages:
    stage = config[name]
    stage_dir = workdir_lib.path(workdir, name)
    epath.Path(stage_dir).mkdir(parents=True, exist_ok=True)
    if previous and not stage.model.checkpoint:
      with stage.unlocked():
        stage.model.checkpoint = previous
    stage_meshes = meshes_lib.build(stage.meshes, runtime.devices)
    if runtime.is_coordinator:  # a stage's workdir is a checkpoint of its own
      workdir_lib.write_text(workdir_lib.path(stage_dir, workdir_lib.CONFIG),
                             stage.to_json_best_effort(indent=2))
      print(f'pipeline: {name} meshes: {stage_meshes.describe()}', flush=True)
    jobs.get(stage.job).run(stage, runtime, stage_meshes, stage_dir,
                            preemption)
    previous = stage_dir
    if runtime.is_coordinator and (result := final_eval(stage_dir)):
      summary.append((name, result))
  if runtime.is_coordinator:
    for name, r in summary:
      print(f'pipeline: after {name}: held-out accuracy '
            f'{r["eval/accuracy"]:.1%} (95% CI {r["eval/ci_low"]:.1%}-'
            f'{r["eval/ci_high"]:.1%}, n={int(r["eval/total"])})')
    rl_stages = [n for n in config.stages
                 if config[n].job in ('grpo', 'ppo', 'agentic')]
    if rl_stages:
      print(f'pipeline: plot {plot(workdir, rl_stages[-1])}')
