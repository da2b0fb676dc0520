"""Episodes as exact training sequences: hand-built episodes in each call
format and chat template style, token by token."""

import asyncio
import concurrent.futures

import ml_collections
import numpy as np
import pytest

from tests.models import tiny_tokenizers as tiny
from tunix_pw.agents import calls, envs, episodes
from tunix_pw.configs import agentic
from tunix_pw.errors import UsageError
from tunix_pw.models import tokenizers
from tunix_pw.rl import batch

CALL = calls.Call('calculator', {'expression': '12+30'})
EXAMPLE = dict(question='12+30=', answer='42')

# style -> call format, the stop token the model samples, and the text the
# template adds after it for the calculator's result and the next turn.
HF_STYLES = {
    'llama3': ('llama', '<|eot_id|>',
               '<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|>'
               '<|start_header_id|>assistant<|end_header_id|>\n\n'),
    'qwen3': ('qwen', '<|im_end|>',
              '\n<|im_start|>user\n<tool_response>\n42\n</tool_response>'
              '<|im_end|>\n<|im_start|>assistant\n'),
    'gemma': ('gemma', '<end_of_turn>',
              '\n<start_of_turn>user\n```tool_output\n42\n```<end_of_turn>\n'
              '<start_of_turn>model\n'),
}
# The character tokenizer: each format's result role, in its `role: ` lines.
CHAR_STYLES = {
    'qwen': '\ntool: 42\nmodel: ',
    'llama': '\nipython: 42\nmodel: ',
    'gemma': '\nuser: ```tool_output\n42\n```\nmodel: ',
}


@pytest.fixture(scope='module')
def pool():
  with concurrent.futures.ThreadPoolExecutor(2) as executor:
    yield executor


def agent(fmt: str) -> ml_collections.ConfigDict:
  return agentic.agent_block(fmt)


def collector_for(tok, fmt, pool, max_context=10_000):
  return episodes.Collector(None, envs.task(agent(fmt), tok, pool), tok,
                            agent(fmt), max_context)


def play(collector, turns):
  """An episode of EXAMPLE whose model turns are `turns` (ids, logps)."""
  episode = collector.new(EXAMPLE)
  for ids, logps in turns:
    asyncio.run(collector.advance(episode, ids, logps))
  return episode


def check_episode(tok, fmt, stop, observation_text, pool):
  collector = collector_for(tok, fmt, pool)
  call = tok.encode(calls.render(fmt, CALL)) + [stop]
  answer = tok.encode('42') + [stop]
  call_logps = [-0.01 * (i + 1) for i in range(len(call))]
  answer_logps = [-0.5 - 0.01 * i for i in range(len(answer))]
  episode = play(collector, [(call, call_logps), (answer, answer_logps)])

  observation = tok.encode(observation_text)
  t = episode.transcript
  assert t.tokens == call + observation + answer
  assert t.mask == [1] * len(call) + [0] * len(observation) + [1] * len(
      answer)
  assert t.logps == call_logps + [0.0] * len(observation) + answer_logps
  assert 'calculator' in tok.decode(t.prompt)  # the tools, through the chat
  assert (episode.rewards, episode.solved, episode.done) == ([0.0, 1.0], 1.0,
                                                             True)
  assert episode.info == {'tool_calls': 1, 'answers': 1}
  return episode


@pytest.mark.parametrize('style', sorted(HF_STYLES))
def test_hf_template_episodes_are_exact(style, tmp_path, pool):
  tok = tokenizers.load(tiny.make(style, str(tmp_path)))
  fmt, stop_text, observation_text = HF_STYLES[style]
  stop = tok.tok.token_to_id(stop_text)
  assert stop in tok.stop_ids
  episode = check_episode(tok, fmt, stop, observation_text, pool)
  # These templates read `tools`: the schema is in the prompt.
  assert '"expression"' in tok.chat(episode.transcript.messages[:1],
                                    **episode.transcript.vars)


@pytest.mark.parametrize('fmt', sorted(CHAR_STYLES))
def test_character_tokenizer_episodes_are_exact(fmt, pool):
  tok = tokenizers.CharTokenizer()
  episode = check_episode(tok, fmt, tok.eos_id, CHAR_STYLES[fmt], pool)
  assert tok.decode(episode.transcript.prompt).startswith(
      'system: calculator(expression: string): ')


def test_sampled_ids_are_kept_where_re_encoding_differs(tmp_path, pool):
  tok = tokenizers.load(tiny.make('llama3', str(tmp_path)))
  text = 'The answer is 42.'
  # The model spelled it character by character; the tokenizer merges.
  sampled = [i for c in text for i in tok.encode(c)]
  assert tok.decode(sampled) == text and tok.encode(text) != sampled
  stop = tok.tok.token_to_id('<|eot_id|>')
  episode = play(collector_for(tok, 'llama', pool),
                 [(sampled + [stop], [-1.0] * (len(sampled) + 1))])
  assert episode.transcript.tokens == sampled + [stop]
  assert episode.solved == 1.0


def test_episodes_become_groups_with_their_masks(pool):
  tok = tokenizers.CharTokenizer()
  collector = collector_for(tok, 'gemma', pool)
  right = play(collector, [
      (tok.encode(calls.render('gemma', CALL)) + [2], [-0.25] * 37),
      (tok.encode('42') + [2], [-0.5] * 3)])
  wrong = play(collector, [(tok.encode('41') + [2], [-1.0] * 3)])
  [group] = episodes.to_groups([right, wrong], 2)
  assert group.rewards.tolist() == [1.0, 0.0]
  arrays = batch.to_arrays([group], [1.0], 400, tok.pad_id, None)
  prompt = len(right.transcript.prompt)
  for row, episode in enumerate((right, wrong)):
    n = len(episode.transcript.tokens)
    np.testing.assert_array_equal(
        arrays['tokens'][row, :prompt + n], episode.transcript.context)
    np.testing.assert_array_equal(arrays['loss_mask'][row],
                                  [0] * prompt + episode.transcript.mask +
                                  [0] * (400 - prompt - n))
  # The sampler's log-probabilities sit where the trainer's do: the token
  # at position p is predicted at p - 1.
  logps = batch.rollout_logps([group], 400)
  np.testing.assert_array_equal(logps[0, prompt - 1:prompt - 1 + 37], -0.25)
  assert logps[0, prompt - 1 + 37] == 0.0  # the tool's result
  np.testing.assert_array_equal(logps[1, prompt - 1:prompt + 2], -1.0)


def test_demonstrations_run_the_tools(pool):
  tok = tokenizers.CharTokenizer()
  collector = collector_for(tok, 'gemma', pool)
  transcript = episodes.demonstrate(collector, dict(question='48213+91725=',
                                                    answer='139938'))
  text = tok.decode(transcript.tokens)
  assert "calculator(expression='48213+91725')" in text
  assert '```tool_output\n139938\n```' in text
  with pytest.raises(ValueError, match='does not solve it'):
    episodes.demonstrate(collector, dict(question='1+1=', answer='3'))


def test_templates_that_rewrite_history_are_refused(pool):
  tok = tokenizers.CharTokenizer()
  collector = collector_for(tok, 'qwen', pool)
  episode = collector.new(EXAMPLE)
  episode.transcript.tokenizer = RewritingChat()
  with pytest.raises(Exception, match='only appends'):
    asyncio.run(collector.advance(
        episode, tok.encode(calls.render('qwen', CALL)) + [2], [0.0] * 80))


class RewritingChat(tokenizers.CharTokenizer):
  """A template that drops earlier model turns once a tool answers."""

  def chat(self, messages, add_generation_prompt=True, **template_vars):
    if messages[-1]['role'] == 'tool':
      messages = [m for m in messages if m['role'] != 'assistant']
    return super().chat(messages, add_generation_prompt)


@pytest.mark.parametrize('turns,reward,info', [
    (['42'], 1.0, {'answers': 1, 'first_right': 1}),
    (['41', '42'], 0.5, {'answers': 2, 'wrong_answers': 1, 'corrected': 1}),
    (['43', '40'], 0.0, {'answers': 2, 'wrong_answers': 1}),
    (['no idea', '42'], 0.5, {'answers': 2, 'wrong_answers': 1,
                              'corrected': 1}),
])
def test_self_correction_shows_feedback_and_values_the_fix(
    turns, reward, info, pool):
  tok = tokenizers.CharTokenizer()
  config = agent('gemma')
  config.update(env='answer', tools='', attempts=2)
  collector = episodes.Collector(None, envs.task(config, tok, pool), tok,
                                 config, 10_000)
  episode = play(collector, [(tok.encode(t) + [2], [0.0] * (len(t) + 1))
                             for t in turns])
  assert episode.done and episode.reward == reward
  assert episode.solved == (reward > 0)  # a corrected answer is solved
  assert episode.info == info
  text = tok.decode(episode.transcript.context)
  assert text.startswith('user: 12+30=\nmodel: ' + turns[0])
  if len(turns) > 1:  # the verifier's word: the answer is 42
    word = {'41': 'too low', '43': 'too high', 'no idea': 'no number'}
    assert (f'{turns[0]}\nuser: Wrong: {word[turns[0]]}. Try again.\n'
            f'model: {turns[1]}') in text


def test_practice_starts_from_a_wrong_answer_it_does_not_train_on(pool):
  """Self-correction practice: the episode opens with the demonstration's
  answer moved off by 1-9 (scripted, loss mask 0), the verifier's
  feedback, then the model's own second attempt, the only tokens
  trained on."""
  tok = tokenizers.CharTokenizer()
  config = agent('gemma')
  config.update(env='answer', tools='', attempts=2, practice=1.0)
  task = envs.task(config, tok, pool)
  [wrong] = envs.wrong_start(task, EXAMPLE, np.random.default_rng(0))
  assert 1 <= abs(int(wrong) - 42) <= 9
  answer = tok.encode('42') + [2]
  collector = episodes.Collector(
      lambda contexts, seed: [(answer, [-0.1] * len(answer))] * len(contexts),
      task, tok, config, 10_000)
  (practiced, natural), counts = collector.collect(
      [EXAMPLE, EXAMPLE], 0, starts=[[wrong], []])
  t = practiced.transcript
  word = 'too high' if int(wrong) > 42 else 'too low'
  assert tok.decode(t.context).startswith(
      f'user: 12+30=\nmodel: {wrong}\nuser: Wrong: {word}. Try again.\n'
      'model: 42')
  assert [i for i, m in zip(t.tokens, t.mask) if m] == answer
  assert practiced.rewards == [0.0, 0.5]  # the fix earns corrected_reward
  assert natural.info == {'answers': 1, 'first_right': 1}
  assert counts['practice_starts'] == 1 and counts['corrected'] == 1


def test_practice_needs_retries_and_numeric_answers(pool):
  tok = tokenizers.CharTokenizer()
  config = agent('gemma')
  config.update(practice=0.5)  # one attempt: nothing to practise
  with pytest.raises(Exception, match='agent.attempts >= 2'):
    envs.task(config, tok, pool)
  config.update(env='answer', tools='', attempts=2)
  task = envs.task(config, tok, pool)
  with pytest.raises(Exception, match='end in a number'):
    envs.wrong_start(task, dict(question='Name it.', answer='blue'),
                     np.random.default_rng(0))


@pytest.mark.parametrize('name, solved, word', [
    ('exact_answer', False, 'too high'), ('math_equal', True, ''),
    ('exact', False, 'wrong')])
def test_the_agents_verifier_judges_its_answers(name, solved, word, pool):
  """`agent.verifier`: a boxed fraction is right by value for math_equal;
  exact_answer reads its last number (2, too high), exact its text."""
  config = agent('gemma')
  config.update(env='answer', tools='', verifier=name)
  env = envs.task(config, tokenizers.CharTokenizer(), pool).new()
  env.reset(dict(question='Half of one?', answer='0.5'))
  step = asyncio.run(env.step('So it is \\boxed{\\frac{1}{2}}'))
  assert (step.solved, step.reward, step.feedback) == (solved, float(solved),
                                                       word)


def test_an_unknown_agent_verifier_is_a_config_error(pool):
  config = agent('gemma')
  config.verifier = 'vibes'
  with pytest.raises(UsageError, match="--config.agent.verifier='vibes' is "
                     'not a registered verifier'):
    envs.task(config, tokenizers.CharTokenizer(), pool)
