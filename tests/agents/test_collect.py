"""Concurrent episode collection: slow tools hold up only their own
episode; failures of every kind are counted and never stop the run.

The policy here is a script (a function of the episode's text) so that
each episode's course is known; the sampler's side of collection runs in
tests/jobs/test_agentic.py."""

import concurrent.futures
import threading

import pytest

from tunix_pw.agents import calls, envs, episodes, tools
from tunix_pw.configs import agentic
from tunix_pw.models import tokenizers

TOK = tokenizers.CharTokenizer()
STOP = TOK.eos_id
RELEASE = threading.Event()  # lets `blocked` return


def instant(x: str) -> str:
  return x


def blocked(x: str) -> str:
  RELEASE.wait(30)
  return x


def broken(x: str) -> str:
  raise RuntimeError('out of order')


def sleepy(x: str) -> str:
  threading.Event().wait(3)
  return x


class Script:
  """Each episode's question names what its first turn does: call a
  tool ('call:<tool>:<digit>'), write a malformed call ('malformed'; every
  turn: 'stubborn'), run past the turn's budget ('ramble'); after a tool's
  result or error it answers with it."""

  def __init__(self, after_answers=None):
    self.batches = []
    self.after_answers = after_answers  # called with the answered questions

  def __call__(self, contexts, seed):
    del seed
    self.batches.append(len(contexts))
    turns, answered = [], []
    for ids in contexts:
      text = TOK.decode(ids)
      question = text.split('user: ')[1].split('\n')[0]
      if question != 'stubborn' and (
          'tool_output' in text or 'error' in text.split('user: ')[-1]):
        body = text.rsplit('```tool_output\n', 1)[-1].split('\n')[0]
        turn, done = TOK.encode(body) + [STOP], True
        answered.append(question)
      elif question == 'ramble':
        turn, done = TOK.encode('x' * 8), False  # no stop token
      elif question in ('malformed', 'stubborn'):
        turn, done = TOK.encode('```tool_code\ninstant(1)\n```') + [STOP], 0
      else:
        call = calls.Call(question.split(':')[1], {'x': question[-1]})
        turn, done = TOK.encode(calls.render('gemma', call)) + [STOP], 0
      del done
      turns.append((turn, [-1.0] * len(turn)))
    if self.after_answers and answered:
      self.after_answers(answered)
    return turns


def collector(script, *, tool_timeout=5.0, episode_timeout=30.0,
              max_concurrent=64, max_context=10_000, malformed_reward=0.0):
  agent = agentic.agent_block('gemma')
  agent.update(tool_timeout=tool_timeout, episode_timeout=episode_timeout,
               failure_reward=-1.0, max_turns=3)
  pool = concurrent.futures.ThreadPoolExecutor(16)
  toolbox = [tools.describe(f) for f in (instant, blocked, broken, sleepy)]
  task = envs.Task(lambda: envs.ToolEnv(toolbox, 'gemma', agent.max_turns,
                                        agent.tool_timeout, pool, [],
                                        malformed_reward),
                   {}, lambda example: [])
  return episodes.Collector(script, task, TOK, agent, max_context,
                            max_concurrent)


def examples(*questions):
  """Episodes of questions whose answer is their last character."""
  return [dict(question=q, answer=q[-1]) for q in questions]


@pytest.mark.parametrize('lockstep', [False, True])
def test_a_slow_tool_holds_up_only_its_own_episode(lockstep):
  """`blocked` returns once the three fast episodes have answered: played
  concurrently they answer while it runs; in lockstep their answers wait
  for it, so it runs out its time limit."""
  RELEASE.clear()

  def after(answered):
    if sum(q == 'call:instant:7' for q in answered) == 3:
      RELEASE.set()

  script = Script(after)
  # Lockstep has to wait out the limit; concurrently it is never reached.
  found, counts = collector(script, tool_timeout=1.0 if lockstep else 30.0
                            ).collect(
      examples('call:blocked:5', *['call:instant:7'] * 3), seed=0,
      lockstep=lockstep)
  assert [e.solved for e in found] == ([True] * 4 if not lockstep
                                       else [False, True, True, True])
  if lockstep:
    assert counts['tool_timeouts'] == 1
    assert script.batches == [4, 4]
  else:
    assert 'tool_timeouts' not in counts
    assert script.batches[0] == 4 and sum(script.batches) == 8
  RELEASE.set()


def test_failures_are_counted_and_the_run_goes_on():
  found, counts = collector(Script(), max_context=200).collect(
      examples('call:instant:7', 'call:broken:1', 'call:nothing:2', 'malformed',
               'ramble'), seed=0)
  by_question = {e.example['question']: e for e in found}
  assert by_question['call:instant:7'].solved is True
  assert counts['tool_calls'] == 3
  assert counts['tool_exceptions'] == 1  # broken
  assert counts['tool_unknowns'] == 1  # nothing
  assert counts['malformed_calls'] == 1
  assert counts['truncated_turns'] == 1  # ramble
  assert by_question['ramble'].rewards == [-1.0]  # the failure reward
  assert not any(by_question[q].solved for q in ('ramble', 'malformed'))
  assert 'RuntimeError: out of order' in TOK.decode(
      by_question['call:broken:1'].transcript.tokens)
  assert 'must' not in counts


def test_out_of_turns_and_over_budget():
  agent_turns, counts = collector(Script(), malformed_reward=-0.2).collect(
      examples('stubborn'), seed=0)
  # A malformed call every turn: three turns, then out of turns, which
  # adds the failure reward.
  assert counts['malformed_calls'] == 3 and counts['out_of_turns'] == 1
  assert agent_turns[0].rewards == [-0.2, -0.2, -0.2, -1.0]
  assert agent_turns[0].done and not agent_turns[0].solved
  found, counts = collector(Script(), max_context=80).collect(
      examples('call:instant:7'), seed=0)
  assert counts['over_budget'] == 1 and found[0].rewards == [0.0, -1.0]
  assert not found[0].solved
  transcript = found[0].transcript
  assert transcript.mask[-1] == 1  # the result that did not fit is dropped


def test_episodes_past_their_time_get_the_failure_reward():
  found, counts = collector(Script(), episode_timeout=1.0).collect(
      examples('call:sleepy:3', 'call:instant:7'), seed=0)
  assert counts['episode_timeouts'] == 1
  assert [e.rewards[-1] for e in found] == [-1.0, 1.0]
  assert [e.solved for e in found] == [False, True]


def test_concurrency_is_bounded():
  script = Script()
  found, _ = collector(script, max_concurrent=2).collect(
      examples(*['call:instant:7'] * 6), seed=0)
  assert all(e.solved for e in found)
  assert max(script.batches) <= 2
