"""KTO against DPO on the preferences task, from the same SFT start.

The demo's SFT stage (2-digit additions, stopped at 35% held-out accuracy)
in a fresh workdir; the pairs job samples it (8 completions per prompt at
temperature 1) into preference pairs (chosen right, rejected wrong, same
prompt) and, for KTO's own format, into labelled samples; then from the
SFT checkpoint, with the same steps, batch and learning rate: DPO on the
pairs, KTO on the same pairs (each pair a desirable and an undesirable
example) and KTO on the labelled samples. Each is scored on the same
held-out pairs (prompts disjoint from training; the labelled samples' test
split gives the same pairs, as the two formats sample alike): the share
the policy prefers the right way by its implicit reward. Prints one JSON
line.

  python benchmarks/kto_vs_dpo.py [--steps=200] [--seed=0]

Target (issue 20): KTO's held-out pairwise accuracy is at least DPO's
minus 3 points.
"""

import argparse
import json
import os
import tempfile
import time

from runs import demo_sft, logged, main_run


def heldout_accuracy(workdir: str) -> float:
  key = 'eval/pairwise_accuracy'
  return logged(workdir, key)[-1][key]


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--steps', type=int, default=200)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    sft = demo_sft(workdir, args.seed)
    data = {}
    for form in ('pairs', 'unpaired'):
      data[form] = os.path.join(workdir, form)
      main_run('--config=tunix_pw/configs/pairs.py:runlocal',
               f'--config.format={form}', f'--config.model.checkpoint={sft}',
               f'--config.output_dir={data[form]}', f'--config.seed={args.seed}',
               f'--workdir={os.path.join(workdir, form + "_job")}')
    # The labelled samples are about 1 right to 4 wrong (3,313 to 12,422):
    # lambda_D = 4 keeps lambda_D n_D / (lambda_U n_U) in the KTO paper's
    # [1, 4/3] (at 1: 38.5% held out, below chance; at 4: 72.4%).
    runs = {'dpo': ('dpo', 'preferences', data['pairs'], 1.0),
            'kto_on_pairs': ('kto', 'preferences', data['pairs'], 1.0),
            'kto_on_unpaired': ('kto', 'unpaired', data['unpaired'], 4.0)}
    accuracy = {}
    for name, (algorithm, dataset, manual_dir, lambda_d) in runs.items():
      run_dir = os.path.join(workdir, name)
      main_run('--config=tunix_pw/configs/dpo.py:runlocal',
               f'--config.dpo.algorithm={algorithm}',
               f'--config.model.checkpoint={sft}',
               f'--config.data.name={dataset}',
               f'--config.data.manual_dir={manual_dir}',
               f'--config.steps={args.steps}', f'--config.seed={args.seed}',
               '--config.optimizer.learning_rate=1e-4',
               f'--config.dpo.kto_lambda_desirable={lambda_d}',
               f'--workdir={run_dir}')
      accuracy[name] = round(heldout_accuracy(run_dir), 4)
    print(json.dumps(dict(
        benchmark='kto_vs_dpo', seed=args.seed, steps=args.steps,
        heldout_pairwise_accuracy=accuracy,
        kto_minus_dpo=round(accuracy['kto_on_pairs'] - accuracy['dpo'], 4),
        wall_s=round(time.perf_counter() - start, 1), target=-0.03)))


if __name__ == '__main__':
  main()
