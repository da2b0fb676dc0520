"""Agentic RL: concurrent episode collection against lockstep turns, and
learning with a calculator tool.

  python benchmarks/agentic.py --part=concurrency   # about 3 minutes
  python benchmarks/agentic.py --part=learning      # about 25 minutes
  python benchmarks/agentic.py --part=retry         # about 10 minutes

concurrency: the same 64 episodes of 4 tool calls each, played by the
tiny model through the sampler (8 sampled tokens a turn), with tool
latencies drawn per call from an exponential distribution of mean 10 ms,
200 ms or 2 s (seeded: both modes wait the same times). Concurrent
collection (each `generate` batches the episodes waiting at that moment)
against lockstep turn batching (each turn waits for every episode's tool).
Prints one JSON line of episodes/s per latency and their ratios.
Target (issue 17): at least 1.5x at 200 ms and 2 s.

learning: `tunix_pw/configs/agentic.py:runlocal` (SFT warm-up on
demonstration episodes, then agentic GRPO), evaluated greedily on the same
held-out problems before and after; prints the start and end accuracy and
fraction of well-formed calls, and writes the run's progress.png.
Target: at least +10 points from a start at or below 50%.

retry: `agentic.py:runlocal,retry` (self-correction on the demo's task:
after a wrong answer the model reads 'Wrong: too high. Try again.' (or too
low) and answers once more; half the training problems start from a
wrong first answer); prints the fraction of wrong first answers that the
second attempt fixes, on the same held-out problems before and after RL
(issue 18).
"""

import argparse
import asyncio
import concurrent.futures
import dataclasses
import json
import os
import random
import tempfile
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

from flax import nnx  # pylint: disable=g-import-not-at-top

from runs import logged, main_run
from tunix_pw.agents import envs, episodes
from tunix_pw.configs import agentic
from tunix_pw.models import decoder, presets, tokenizers
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.sampling.sampler import Sampler

EPISODES, TURNS, TOKENS = 64, 4, 8


@dataclasses.dataclass
class LatencyEnv:
  """TURNS tool calls of seeded latencies (whatever the model writes),
  then done."""

  latencies: list[float]
  pool: concurrent.futures.Executor

  def reset(self, example):
    self.turn = 0
    return [dict(role='user', content=example['question'])]

  async def step(self, model_turn):
    del model_turn
    await asyncio.get_running_loop().run_in_executor(
        self.pool, time.sleep, self.latencies[self.turn])
    self.turn += 1
    if self.turn == TURNS:
      return envs.Step(None, 1.0, True, {'tool_calls': 1})
    return envs.Step([dict(role='tool', content='ok')], 0.0, False,
                     {'tool_calls': 1})


def collection(mean: float, lockstep: bool, sampler: Sampler) -> float:
  """Episodes per second of one collection at mean tool latency `mean`."""
  tok = tokenizers.CharTokenizer()
  rng = random.Random(0)
  latencies = [[rng.expovariate(1 / mean) for _ in range(TURNS)]
               for _ in range(EPISODES)]
  pool = concurrent.futures.ThreadPoolExecutor(EPISODES)
  queue = iter(latencies)
  task = envs.Task(lambda: LatencyEnv(next(queue), pool), {}, lambda e: [])
  sampling = SamplingConfig(max_new_tokens=TOKENS, ignore_eos=True)
  inner = episodes.sampler_generate(sampler, sampling, 1)

  def generate(contexts, seed):  # each turn: the sampled tokens, then stop
    return [(ids + [tok.eos_id], logps + [0.0])
            for ids, logps in inner(contexts, seed)]

  agent = agentic.agent_block('qwen')
  agent.episode_timeout = 600.0
  collector = episodes.Collector(generate, task, tok, agent, 1024, EPISODES)
  examples = [dict(question=f'{i}+{i}=', answer=str(2 * i))
              for i in range(EPISODES)]
  start = time.perf_counter()
  found, counts = collector.collect(examples, seed=0, lockstep=lockstep)
  seconds = time.perf_counter() - start
  assert all(e.done and e.solved for e in found), counts
  pool.shutdown()
  return EPISODES / seconds


def concurrency() -> dict:
  model = decoder.Decoder(presets.PRESETS['tiny-gemma'], rngs=nnx.Rngs(0))
  tok = tokenizers.CharTokenizer()
  sampler = Sampler(model, pad_id=tok.pad_id, eos_ids=tok.stop_ids)
  sampling = SamplingConfig(max_new_tokens=TOKENS, ignore_eos=True)
  for size in (1, 2, 4, 8, 16, 32, 64):  # compile every shape first
    for length in (16, 32, 64, 128):
      sampler.generate([[5] * (length - 1)] * size, sampling)
  out = {}
  for mean in (0.01, 0.2, 2.0):
    lock = collection(mean, True, sampler)
    conc = collection(mean, False, sampler)
    out[f'{mean * 1000:g}ms'] = dict(lockstep_eps=round(lock, 2),
                                     concurrent_eps=round(conc, 2),
                                     ratio=round(conc / lock, 2))
  return dict(benchmark='agentic_concurrency', episodes=EPISODES,
              turns=TURNS, **out)


def learning(keep: str, retry: bool) -> dict:
  """The calculator demo (or, with `retry`, self-correction): held-out
  figures per evaluation of the agentic stage, and the rollouts' fraction
  of well-formed calls per step."""
  workdir = keep or tempfile.mkdtemp(prefix='agentic_')
  start = time.perf_counter()
  main_run(f'--config=tunix_pw/configs/agentic.py:runlocal'
           f'{",retry" if retry else ""}', f'--workdir={workdir}')
  stage = os.path.join(workdir, 'agentic')
  evals = logged(stage, 'eval/accuracy')
  keys = ('accuracy', 'first_right_fraction', 'fix_rate') if retry else (
      'accuracy', 'well_formed_calls', 'tool_use')
  out = dict(benchmark='agentic_retry' if retry else 'agentic_learning',
             heldout=int(evals[0]['eval/total']),
             eval_steps=[m['step'] for m in evals],
             **{k: [round(m[f'eval/{k}'], 4) for m in evals] for k in keys})
  out['gain_points'] = round(100 * (out[keys[-1] if retry else 'accuracy'][-1]
                                    - out[keys[-1] if retry else 'accuracy'][0]),
                             1)
  if not retry:  # sampled at temperature 1, per step
    steps = logged(stage, 'well_formed_calls')
    out['rollout_well_formed_calls'] = [round(m['well_formed_calls'], 4)
                                        for m in steps[::10]]
  out.update(progress_png=os.path.join(workdir, 'progress.png'),
             seconds=round(time.perf_counter() - start))
  return out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--part', choices=('concurrency', 'learning', 'retry'),
                      required=True)
  parser.add_argument('--workdir', default='',
                      help='learning: keep the run here')
  args = parser.parse_args()
  result = (concurrency() if args.part == 'concurrency'
            else learning(args.workdir, args.part == 'retry'))
  print(json.dumps(result))


if __name__ == '__main__':
  main()
