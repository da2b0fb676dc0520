"""Distillation against SFT alone in a data-limited regime.

A teacher: the demo's SFT stage continued to `--teacher_steps` on the whole
train split (it then solves nearly every held-out problem). A fresh tiny
student sees only the first `--examples` training problems: SFT alone
(`tunix_pw/configs/sft.py:runlocal`), then logit distillation from the
teacher (`tunix_pw/configs/distill.py:runlocal`: the data's NLL plus the
forward KL to the teacher's next-token distributions), same steps, batch,
learning rate and seed. Both are scored by greedy exact match on the same
held-out problems (disjoint from the teacher's and the student's
training). Then, from the SFT-alone checkpoint, `--more` steps of SFT
against as many of on-policy distillation (`grpo.py:runlocal,distill`:
the sampled tokens' log-ratios and GKD's whole-distribution term, 256
samples of the same prompts per step). Prints one JSON line.

  python benchmarks/distill.py [--steps=600] [--examples=1000] [--seed=0]
      [--teacher=WORKDIR] [--more=200]

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
  parser.add_argument('--more', type=int, default=200)
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
    start_dir = os.path.join(workdir, 'sft')
    for name, config in (('sft_more', 'sft.py:runlocal'),
                         ('on_policy', 'grpo.py:runlocal,distill')):
      run_dir = os.path.join(workdir, name)
      main_run(f'--config=tunix_pw/configs/{config}',
               f'--config.model.checkpoint={start_dir}', *common[:1],
               f'--config.steps={args.more}', f'--config.seed={args.seed}',
               '--config.checkpoint.every=0', f'--workdir={run_dir}',
               *([f'--config.teacher.checkpoint={teacher}',
                  '--config.optimizer.learning_rate=2e-4',
                  '--config.rl.prompts_per_step=32',
                  '--config.rl.mini_batch_size=256',
                  '--config.rl.micro_batch_size=64',
                  '--config.rl.logps_micro_batch_size=128']
                 if name == 'on_policy' else []))
      student[name] = final_accuracy(run_dir)
    print(json.dumps(dict(
        benchmark='distill', seed=args.seed, steps=args.steps,
        train_examples=args.examples, teacher=final_accuracy(teacher),
        student=student,
        kd_minus_sft=round(student['logit_kd'] - student['sft'], 4),
        on_policy_minus_sft_more=round(
            student['on_policy'] - student['sft_more'], 4),
        wall_s=round(time.perf_counter() - start, 1),
        targets=dict(teacher_lead=0.2, kd_minus_sft=0.05))))


if __name__ == '__main__':
  main()
