"""GRPO step time and its phases, disaggregated on 8 virtual CPU devices.

The sampler benchmark's model (Gemma architecture, vocab 256, 4 layers,
embed 256, 4 heads / 1 KV head, MLP 1024); 4 prompts x 4 generations;
prompts of 32 tokens and 32 new tokens; actor fsdp=4 on devices 0-3,
rollout tp=4 on devices 4-7, weights synced by reshard every step. The
GRPO job runs through main in this process; the same prompts then run
through a standalone sampler on the same tp=4 mesh. Prints one JSON line.

  python benchmarks/grpo_step.py [--steps=12]

Targets: weight sync <= 5% of the step; rollout tokens/s inside the loop
>= 80% of the standalone sampler's.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

jax.config.update('jax_num_cpu_devices', 8)

from in_process import run_main  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.configs import common  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.models import checkpoints, presets, tokenizers  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.runtime import meshes  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.sampling.rollout import SamplingConfig  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.sampling.sampler import make_sampler  # pylint: disable=g-import-not-at-top,wrong-import-position

MODEL = presets.PRESETS['gemma-2b'].replace(
    vocab_size=256, num_layers=4, embed_dim=256, num_heads=4, num_kv_heads=1,
    head_dim=64, mlp_dim=1024)
PROMPT, NEW, PROMPTS, GENERATIONS = 32, 32, 4, 4


def write_dataset(directory: str) -> None:
  """GSM8K-format problems whose prompts are 32 tokens (bos + 31 chars)."""
  rng = np.random.default_rng(0)
  for split, n in (('train', 256), ('test', 16)):
    with open(os.path.join(directory, f'{split}.jsonl'), 'w') as f:
      for _ in range(n):
        question = ''.join(rng.choice(list('0123456789+'), PROMPT - 2)) + '='
        f.write(json.dumps({'question': question,
                            'answer': 'x\n#### 7'}) + '\n')


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--steps', type=int, default=12)
  args = parser.parse_args()
  presets.PRESETS['bench-gemma'] = MODEL
  work = tempfile.mkdtemp()
  write_dataset(work)
  samples = PROMPTS * GENERATIONS
  logged = [m for m in run_main([
      '--config=tunix_pw/configs/grpo.py:runlocal',
      '--config.model.preset=bench-gemma',
      f'--config.data.name=gsm8k', f'--config.data.manual_dir={work}',
      f'--config.data.data_dir={work}/tfds',
      f'--config.rl.prompts_per_step={PROMPTS}',
      f'--config.rl.num_generations={GENERATIONS}',
      f'--config.rl.mini_batch_size={samples}',
      f'--config.rl.micro_batch_size={samples}',
      f'--config.rl.logps_micro_batch_size={samples}',
      f'--config.rl.max_prompt_length={PROMPT}',
      f'--config.rl.max_new_tokens={NEW}', '--config.rl.kl_beta=0',
      f'--config.steps={args.steps}', '--config.eval_examples=0',
      '--config.checkpoint.every=0', '--config.runtime.host_device_count=0',
      f'--workdir={work}/run'], f'{work}/run')
            if 'loss' in m][2:]  # past compilation
  phases = {k: statistics.median(m[f'time/{k}'] for m in logged)
            for k in ('rollout', 'logps', 'train', 'weight_sync')}
  step = statistics.median(sum(m[f'time/{k}'] for k in phases)
                           for m in logged)
  in_loop = statistics.median(m['rollout_tokens_per_s'] for m in logged)

  # The standalone sampler: same model, mesh, batch and lengths.
  tokenizer = tokenizers.CharTokenizer()
  rollout = meshes.build(common.meshes('disaggregated',
                                       rollout=('fsdp=1,tp=4', '4:8')),
                         jax.devices())['rollout']
  model = checkpoints.init(MODEL, seed=0, mesh=rollout,
                           rules=common.sharding())
  sampler = make_sampler(model, tokenizer, mesh=rollout,
                         rules=common.sharding(),
                         max_cache=PROMPT + NEW)
  rng = np.random.default_rng(1)
  prompts = [[1] + rng.integers(4, 100, PROMPT - 1).tolist()
             for _ in range(samples)]
  config = SamplingConfig(max_new_tokens=NEW, ignore_eos=True)
  sampler.generate(prompts, config)
  rates = []
  for _ in range(5):
    start = time.perf_counter()
    out = sampler.generate(prompts, config)
    jax.block_until_ready(out.tokens)
    rates.append(samples * NEW / (time.perf_counter() - start))
  standalone = statistics.median(rates)
  print(json.dumps(dict(
      benchmark='grpo_step', step_s=round(step, 4),
      phases_s={k: round(v, 4) for k, v in phases.items()},
      weight_sync_fraction=round(phases['weight_sync'] / step, 4),
      rollout_tokens_per_s_in_loop=round(in_loop, 1),
      standalone_sampler_tokens_per_s=round(standalone, 1),
      in_loop_vs_standalone=round(in_loop / standalone, 3),
      targets=dict(weight_sync_fraction=0.05, in_loop_vs_standalone=0.8))))


if __name__ == '__main__':
  main()
