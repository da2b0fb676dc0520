"""Distillation against SFT alone in a data-limited regime.

A teacher: the demo's SFT stage continued to `--teacher_steps` on the whole
train split (it then solves nearly every held-out problem). A fresh tiny
student sees only the first `--examples` training problems: SFT alone
(`tunix_pw/configs/sft.py:runlocal`), then logit distillation from the
teacher (`tunix_pw/configs/distill.py:runlocal`: the data's NLL plus the
forward KL to the teacher's next-token distributions), same steps, batch,
learning rate and seed. Both are scored by greedy exact match on the same
held-out problems (disjoint from the teacher's and the student's
training). Then, from the SFT student after `--start` steps, the rest of
the steps by SFT against as many of on-policy distillation
(`grpo.py:runlocal,distill`: the student samples one completion of each
of 64 training prompts per step, GKD's term, the forward KL at
temperature 2 from the teacher's whole next-token distribution at every
sampled position; SFT's batch size, learning rate and schedule). Prints
one JSON line.

  python benchmarks/distill.py [--steps=600] [--examples=1000] [--seed=0]
      [--teacher=WORKDIR] [--start=200]

Targets (issue 20): the teacher at least 20 points ahead of the student's
SFT result; logit distillation at least 5 points above SFT alone;
on-policy distillation above SFT alone from the same start.
"""

import argparse
import json
import os
import tempfile
import time

from runs import demo_sft, logged, main_run


def final_accuracy(workdir: str) -> float:
  return logged(workdir, 'eval/accuracy')[-1]['eval/accuracy']


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--steps', type=int, default=600)
  parser.add_argument('--examples', type=int, default=1000)
  parser.add_argument('--teacher_steps', type=int, default=3000)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--start', type=int, default=200,
                      help='SFT steps before on-policy distillation')
  parser.add_argument('--teacher', default='',
                      help='an existing teacher workdir (skips training one)')
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    teacher = args.teacher
    if not teacher:
      teacher = demo_sft(workdir, args.seed, args.teacher_steps)
    common = [f'--config.data.train_examples={args.examples}',
              f'--config.steps={args.steps}', f'--config.seed={args.seed}',
              '--config.eval_every=0', '--config.checkpoint.every=0']
    student = {}
    for name, config in (('sft', 'sft'), ('logit_kd', 'distill')):
      run_dir = os.path.join(workdir, name)
      main_run(f'--config=tunix_pw/configs/{config}.py:runlocal', *common,
               *([f'--config.teacher.checkpoint={teacher}']
                 if config == 'distill' else []), f'--workdir={run_dir}')
      student[name] = final_accuracy(run_dir)
    start_dir = os.path.join(workdir, 'start')
    main_run('--config=tunix_pw/configs/sft.py:runlocal', *common[:1],
             f'--config.steps={args.start}', *common[2:],
             f'--workdir={start_dir}')
    student['start'] = final_accuracy(start_dir)
    rest = [f'--config.model.checkpoint={start_dir}',
            f'--config.steps={args.steps - args.start}', *common[:1],
            *common[2:]]
    main_run('--config=tunix_pw/configs/sft.py:runlocal', *rest,
             f'--workdir={workdir}/sft_rest')
    student['sft_rest'] = final_accuracy(f'{workdir}/sft_rest')
    main_run('--config=tunix_pw/configs/grpo.py:runlocal,distill', *rest,
             f'--config.teacher.checkpoint={teacher}',
             '--config.distill.token_weight=0', '--config.rl.num_generations=1',
             *(f'--config.rl.{key}=64' for key in (
                 'prompts_per_step', 'mini_batch_size', 'micro_batch_size',
                 'logps_micro_batch_size')),
             '--config.optimizer.learning_rate=3e-3',
             '--config.optimizer.warmup_steps=20',
             '--config.optimizer.schedule=cosine',
             f'--workdir={workdir}/on_policy')
    student['on_policy'] = final_accuracy(f'{workdir}/on_policy')
    print(json.dumps(dict(
        benchmark='distill', seed=args.seed, steps=args.steps,
        train_examples=args.examples, teacher=final_accuracy(teacher),
        student=student,
        kd_minus_sft=round(student['logit_kd'] - student['sft'], 4),
        on_policy_minus_sft=round(
            student['on_policy'] - max(student['sft'], student['sft_rest']),
            4),
        wall_s=round(time.perf_counter() - start, 1),
        targets=dict(teacher_lead=0.2, kd_minus_sft=0.05,
                     on_policy_minus_sft=0))))


if __name__ == '__main__':
  main()
