"""Data pipeline throughput beside what the demo's train step consumes.

Examples/s of the tokenizing SFT pipelines (grain over array_record, the
built-in character tokenizer, padding to buckets) for the arithmetic and
chat builders, and the examples/s the demo's SFT warm-up step consumes
(measured by running it here). Prints one JSON line.

  python benchmarks/data.py

Target: the pipelines feed at least 10x what the train step consumes.
"""

import json
import os
import statistics
import tempfile
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

# Under the allocator jobs run under (both sides, where a peer runs too).
from tunix_pw.runtime import allocator  # pylint: disable=g-import-not-at-top,wrong-import-position
allocator.use_tcmalloc()

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from in_process import run_main  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.data import formats, pipeline  # pylint: disable=g-import-not-at-top,wrong-import-position
from tunix_pw.models.tokenizers import CharTokenizer  # pylint: disable=g-import-not-at-top,wrong-import-position

BATCH, BATCHES = 64, 60


def write_chat(directory: str) -> None:
  rng = np.random.default_rng(0)
  words = ['the', 'sum', 'of', 'two', 'numbers', 'is', 'what', 'please',
           'add', 'and', 'tell', 'me']
  for split, n in (('train', 4000), ('test', 100)):
    with open(os.path.join(directory, f'{split}.jsonl'), 'w') as f:
      for _ in range(n):
        turns = [dict(role=r, content=' '.join(rng.choice(words, 6)))
                 for r in ('user', 'model', 'user', 'model')]
        f.write(json.dumps({'messages': turns}) + '\n')


def examples_per_second(name: str, work: str) -> float:
  spec = pipeline.DataSpec(name, os.path.join(work, 'tfds'),
                           work if name == 'chat' else '')
  source = pipeline.prepare(spec)[0]['train']
  tokenizer = CharTokenizer()
  length = 64 if name == 'chat' else 16
  rates = []
  for seed in range(3):
    reader = pipeline.Pipeline(
        source, formats.sft_transform(name, tokenizer, length, 'truncate',
                                      False),
        batch_size=BATCH, seed=seed, num_epochs=None,
        batch_fn=lambda rows: pipeline.pad_batch(
            rows, pipeline.bucket(max(len(r['tokens']) for r in rows)), 0))
    start = time.perf_counter()
    for _ in range(BATCHES):
      next(reader)
    rates.append(BATCH * BATCHES / (time.perf_counter() - start))
  return statistics.median(rates)


def demo_consumption(work: str) -> float:
  """Examples/s the demo's SFT warm-up step consumes, measured."""
  logged = [m for m in run_main(
      ['--config=tunix_pw/configs/demo.py', '--config.stages=("sft",)',
       '--config.sft.steps=60', '--config.sft.log_every=20',
       '--config.sft.eval_examples=0', '--config.sft.stop_at_accuracy=0',
       f'--workdir={work}/demo'],
      f'{work}/demo/sft') if 'step_seconds' in m][1:]  # past compilation
  return BATCH / statistics.median(m['step_seconds'] for m in logged)


def main() -> None:
  work = tempfile.mkdtemp()
  write_chat(work)
  arithmetic = examples_per_second('arithmetic', work)
  chat = examples_per_second('chat', work)
  consumed = demo_consumption(work)
  print(json.dumps(dict(
      benchmark='data', arithmetic_examples_per_s=round(arithmetic),
      chat_examples_per_s=round(chat),
      demo_train_step_examples_per_s=round(consumed),
      headroom=round(min(arithmetic, chat) / consumed, 1),
      target_headroom=10)))


if __name__ == '__main__':
  main()
