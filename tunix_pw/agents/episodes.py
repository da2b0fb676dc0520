"""Multi-turn episodes as exact training sequences, collected concurrently.

A `Transcript` is one episode's sequence: the opening prompt through the
chat template, then each model turn's sampled ids verbatim (never
re-encoded from their text; loss mask 1, the sampler's log-probabilities)
and each observation's ids (mask 0, log-probability 0). An observation's
ids are the text the template adds for it: what the template closes the
model's turn with, less the stop token the model sampled, then the
observation's turns and the next generation prompt.

`Collector` plays many episodes at once on an asyncio loop. Each
`generate` call batches the episodes waiting for a model turn (it goes
once all episodes in play wait, or once its first turn has waited as long
as the last call took), on a thread of its own, while tools run on a
pool: a slow tool holds up its own episode only. With `lockstep` every turn waits for all
episodes' tools first (the baseline `benchmarks/agentic.py` measures
against). Episodes run at most `agent.max_concurrent` at a time, each
within `agent.episode_timeout` seconds; one that runs out of time, out of
turns, out of context or ends a turn without a stop token adds
`agent.failure_reward` to its turns' rewards, and is counted. An episode's
`solved` is the verifier's verdict on its answer (never for those): it,
not the reward (which may hold malformed-call penalties, a code task's
fraction of tests or a retry's scaled reward), is what `exact_answer`,
held-out accuracy and its interval count.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
import concurrent.futures
import dataclasses
import functools
import time
from typing import Any

import numpy as np

from tunix_pw.agents import envs as envs_lib
from tunix_pw.data import pipeline
from tunix_pw.errors import UsageError
from tunix_pw.rl import batch as batch_lib
from tunix_pw.runtime.fetch import fetch

_MARK = 'TURNx7f3a'  # a model turn whose closing the template shows


def closing(tokenizer: Any, template_vars: dict[str, Any]) -> str:
  """The text the template puts after a model turn's content."""
  text = tokenizer.chat([dict(role='user', content='x'),
                         dict(role='assistant', content=_MARK)], False,
                        **template_vars)
  return text[text.rindex(_MARK) + len(_MARK):]


class Transcript:
  """One episode's token sequence and messages."""

  def __init__(self, tokenizer: Any, messages: list[dict[str, str]],
               template_vars: dict[str, Any], closing_text: str):
    self.tokenizer, self.vars = tokenizer, template_vars
    self.closing = closing_text  # `closing(tokenizer, template_vars)`
    self.messages = list(messages)
    self.prompt = tokenizer.encode_chat(self.messages, True, **template_vars)
    self.tokens: list[int] = []  # after the prompt
    self.mask: list[int] = []  # 1 on model tokens
    self.logps: list[float] = []  # the sampler's, 0 on observation tokens

  @property
  def context(self) -> list[int]:
    return self.prompt + self.tokens

  def model_turn(self, ids: Sequence[int], logps: Sequence[float],
                 trained: bool = True) -> str:
    """Appends sampled ids as they are (loss mask 1, or 0 for a scripted
    turn not `trained`); returns their text."""
    stops = self.tokenizer.stop_ids
    text = self.tokenizer.decode([i for i in ids if i not in stops])
    self.tokens += list(ids)
    self.mask += [int(trained)] * len(ids)
    self.logps += list(logps)
    self.messages.append(dict(role='assistant', content=text))
    return text

  def observation(self, messages: list[dict[str, str]]) -> None:
    """Appends the template's ids for `messages` after the model's turn."""
    chat = functools.partial(self.tokenizer.chat, **self.vars)
    before = chat(self.messages, False)
    after = chat(self.messages + messages, True)
    closing = self.closing
    if not (after.startswith(before) and before.endswith(closing)):
      raise UsageError('the chat template renders earlier turns differently '
                       'once later ones follow; multi-turn episodes need a '
                       'template that only appends.')
    stop = self.tokenizer.special_text(self.tokens[-1]) if (
        self.tokens and self.tokens[-1] in self.tokenizer.stop_ids) else ''
    bridge = closing[len(stop):] if stop and closing.startswith(
        stop) else closing
    ids = self.tokenizer.encode(bridge + after[len(before):])
    self.tokens += ids
    self.mask += [0] * len(ids)
    self.logps += [0.0] * len(ids)
    self.messages += messages


  def cut(self, length: int) -> None:
    """Drops what follows the first `length` tokens after the prompt."""
    del self.tokens[length:], self.mask[length:], self.logps[length:]


@dataclasses.dataclass
class Episode:
  example: dict[str, Any]
  env: envs_lib.Env
  transcript: Transcript
  rewards: list[float] = dataclasses.field(default_factory=list)  # per turn
  info: Counter = dataclasses.field(default_factory=Counter)
  done: bool = False
  solved: bool = False  # the verifier's verdict: exact_answer, accuracy

  @property
  def reward(self) -> float:
    return float(sum(self.rewards))

  def fail(self, why: str, reward: float) -> None:
    self.info[why] += 1
    self.rewards.append(reward)
    self.done = True


Generate = Callable[[list[list[int]], int], list[tuple[list[int],
                                                         list[float]]]]


def batch(n: int, quantum: int) -> int:
  """The batch a generate call of `n` contexts runs at: `quantum` x a
  power of two."""
  return quantum * (1 << (-(-n // quantum) - 1).bit_length())


def sampler_generate(sampler: Any, sampling: Any, quantum: int) -> Generate:
  """(contexts, seed) -> each context's turn (ids, log-probabilities),
  batches padded to `quantum` x a power of two (few compiled shapes)."""

  def generate(contexts, seed):
    n = len(contexts)
    out = sampler.generate(contexts + [contexts[0]] * (batch(n, quantum) - n),
                           dataclasses.replace(sampling, seed=seed))
    tokens, logps, lengths = fetch((out.tokens, out.logprobs, out.lengths))
    return [(tokens[r, :lengths[r]].tolist(), logps[r, :lengths[r]].tolist())
            for r in range(n)]

  return generate


class Collector:
  """Plays episodes of `task` with `generate`; see the module doc."""

  def __init__(self, generate: Generate | None, task: envs_lib.Task,
               tokenizer: Any, agent: Any, max_context: int,
               max_concurrent: int = 0):
    self.generate, self.task, self.tokenizer = generate, task, tokenizer
    self.agent, self.max_context = agent, max_context
    self.max_concurrent = max_concurrent or agent.max_concurrent
    self._closing = closing(tokenizer, task.template_vars)
    self._engine = concurrent.futures.ThreadPoolExecutor(1, 'generate')

  def new(self, example: dict[str, Any]) -> Episode:
    env = self.task.new()
    return Episode(example, env, Transcript(
        self.tokenizer, env.reset(example), self.task.template_vars,
        self._closing))

  def collect(self, examples: Sequence[dict[str, Any]], seed: int,
              lockstep: bool = False, starts: Sequence[list[str]] = ()
              ) -> tuple[list[Episode], Counter]:
    """One episode per example (repeat an example for a group); returns
    them in order, with the run's counts. `starts`: per episode, model
    turns to script first (not trained on; self-correction practice)."""
    episodes = [self.new(e) for e in examples]
    self._seed, self._calls = seed, Counter()
    play = self._lockstep if lockstep else self._concurrent

    async def run():
      for episode, turns in zip(episodes, starts):
        if turns:
          episode.info['practice_starts'] += 1
          await self.script(episode, turns, trained=False)
      await play([e for e in episodes if not e.done])

    asyncio.run(run())
    counts = sum((e.info for e in episodes), Counter()) + self._calls
    return episodes, counts

  # ------------------------------------------------------------- turns

  async def _run_generate(self, contexts: list[list[int]]):
    self._calls['generate_calls'] += 1
    self._calls['model_turns'] += len(contexts)
    seed = self._seed * 1_000_003 + self._calls['generate_calls']
    return await asyncio.get_running_loop().run_in_executor(
        self._engine, self.generate, contexts, seed)

  async def advance(self, episode: Episode, ids: list[int],
                    logps: list[float], trained: bool = True) -> None:
    """The model's turn, then the environment's answer to it."""
    text = episode.transcript.model_turn(ids, logps, trained)
    if not ids or ids[-1] not in self.tokenizer.stop_ids:
      return episode.fail('truncated_turns', self.agent.failure_reward)
    step = await episode.env.step(text)
    episode.rewards.append(step.reward)
    episode.info.update(step.info)
    if step.failed:
      episode.fail(step.failed, self.agent.failure_reward)
    elif step.done:
      episode.done, episode.solved = True, step.solved
    else:
      transcript, length = episode.transcript, len(episode.transcript.tokens)
      transcript.observation(step.observation)
      if len(transcript.context) > self.max_context:  # no room to answer
        transcript.cut(length)
        episode.fail('over_budget', self.agent.failure_reward)

  async def script(self, episode: Episode, turns: list[str],
                   trained: bool) -> None:
    """`turns` played as the model's (their ids the tokenizer's encoding,
    plus the first stop token), the environment really answering."""
    stop = self.tokenizer.stop_ids[0]
    for text in turns:
      ids = self.tokenizer.encode(text) + [stop]
      await self.advance(episode, ids, [0.0] * len(ids), trained)

  # ------------------------------------------------- concurrent episodes

  async def _concurrent(self, episodes: list[Episode]) -> None:
    self._waiting: list[tuple[list[int], asyncio.Future]] = []
    self._draining, self._active = None, 0
    self._changed = asyncio.Event()  # a turn is waiting, or an episode ended
    self._window = 0.0  # the last generate call's seconds
    slots = asyncio.Semaphore(self.max_concurrent)

    async def play(episode):
      async with slots:
        self._active += 1
        try:
          await asyncio.wait_for(self._play(episode),
                                 self.agent.episode_timeout)
        except TimeoutError:
          episode.fail('episode_timeouts', self.agent.failure_reward)
        finally:
          self._active -= 1
          self._changed.set()

    await asyncio.gather(*(play(e) for e in episodes))

  async def _play(self, episode: Episode) -> None:
    while not episode.done:
      future = asyncio.get_running_loop().create_future()
      self._waiting.append((episode.transcript.context, future))
      self._changed.set()
      if self._draining is None:
        self._draining = asyncio.ensure_future(self._drain())
      await self.advance(episode, *await future)

  async def _drain(self) -> None:
    """Generates for the episodes waiting, batch after batch. A batch
    goes once every episode in play waits, or once its first turn has
    waited as long as the last generate call took: a tool that returns
    soon joins it, a slow one does not hold it up."""
    loop = asyncio.get_running_loop()
    while self._waiting:
      deadline = loop.time() + self._window
      while len(self._waiting) < self._active and loop.time() < deadline:
        self._changed.clear()
        try:
          await asyncio.wait_for(self._changed.wait(),
                                 deadline - loop.time())
        except TimeoutError:
          break
      batch, self._waiting = self._waiting, []
      start = loop.time()
      try:
        turns = await self._run_generate([c for c, _ in batch])
      except Exception as e:  # pylint: disable=broad-except
        turns = [e] * len(batch)
      self._window = loop.time() - start
      for (_, future), turn in zip(batch, turns):
        if not future.done():  # its episode may have timed out
          (future.set_exception if isinstance(turn, Exception)
           else future.set_result)(turn)
    self._draining = None

  # -------------------------------------------------- lockstep baseline

  async def _lockstep(self, episodes: list[Episode]) -> None:
    deadline = time.monotonic() + self.agent.episode_timeout
    active = episodes
    while active:
      turns = await self._run_generate([e.transcript.context for e in active])
      await asyncio.gather(*(self.advance(e, *t)
                             for e, t in zip(active, turns)))
      active = [e for e in active if not e.done]
      if time.monotonic() > deadline:
        for e in active:
          e.fail('episode_timeouts', self.agent.failure_reward)
        active = []


def demonstrate(collector: Collector, example: dict[str, Any]) -> Transcript:
  """A right episode of `example`, its model turns scripted (their ids
  the tokenizer's encoding, plus the first stop token) and the
  environment (tools included) really run: SFT warm-up data."""
  episode = collector.new(example)
  asyncio.run(collector.script(episode, collector.task.demonstration(example),
                               trained=True))
  if not episode.solved:
    raise ValueError(f'the demonstration of {example} does not solve it: '
                     f'{episode.transcript.messages}')
  return episode.transcript


def to_groups(episodes: list[Episode], size: int) -> list[batch_lib.Group]:
  """Consecutive runs of `size` episodes of one example -> GRPO groups."""
  out = []
  for i in range(0, len(episodes), size):
    group = episodes[i:i + size]
    out.append(batch_lib.Group(
        prompt=group[0].transcript.prompt, answer=group[0].example['answer'],
        completions=[e.transcript.tokens for e in group],
        truncated=[bool(e.info['truncated_turns']) for e in group],
        rewards=np.array([e.reward for e in group], np.float32),
        per_reward={'exact_answer': np.array([e.solved for e in group],
                                             np.float32)},  # verdicts
        logprobs=[e.transcript.logps for e in group],
        masks=[e.transcript.mask for e in group]))
  return out


def sft_transform(agent: Any, tokenizer: Any, max_length: int,
                  overlong: str) -> Callable:
  """Example -> its demonstration episode as an SFT sequence, the loss on
  the model's turns (the SFT job's data with --config.agent)."""
  tools = concurrent.futures.ThreadPoolExecutor(1, 'demo-tool')
  collector = Collector(None, envs_lib.task(agent, tokenizer, tools),
                        tokenizer, agent, max_length)

  def transform(example, counters):
    transcript = demonstrate(collector, example)
    return pipeline.fit(transcript.context,
                        [0] * len(transcript.prompt) + transcript.mask,
                        max_length, overlong, counters)

  return transform
