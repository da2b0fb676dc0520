"""The LLM judge: its answers parsed into rewards, malformed ones given the
configured reward and counted (a scripted judge), and a real one grading a
GRPO run through main."""

import collections
import json

import numpy as np
import pytest

from tests import helpers
from tunix_pw.configs import grpo as grpo_config
from tunix_pw.rl import batch, judge, rewards
from tunix_pw.train import metrics


@pytest.mark.parametrize('answer, expected', [
    ('7', 0.7), (' 10', 1.0), ('0', 0.0), ('8/10 good', 0.8),
    ('Score: 4.5 points', 0.45), ('great!', None), ('', None),
    ('11', None), ('-3', None)])
def test_parse(answer, expected):
  got = judge.parse(answer, 10.0)
  assert got == pytest.approx(expected) if expected is not None else \
      got is None


def scripted_rl():
  rl = grpo_config.get_config('runlocal').rl
  rl.judge_malformed = -0.5
  return rl


def test_a_scripted_judge_scores_and_counts_malformed_answers():
  seen = []

  def answers(asks):
    seen.extend(asks)
    return ['9', 'no idea', '3', '42']

  scores, malformed = judge.Judge(answers, scripted_rl())(
      ['1+1=', '2+2=', '3+3=', '4+4='], ['2', '5', '6', '8'])
  np.testing.assert_allclose(scores, [0.9, -0.5, 0.3, -0.5])
  assert malformed == 2
  assert seen[1] == ('Rate the answer from 0 to 10.\nQuestion: 2+2=\n'
                     'Answer: 5\nScore: ')


def test_the_scorers_put_the_judges_scores_on_the_samples():
  counts = {}
  fields = batch.Scorers(judge=judge.Judge(lambda asks: ['5', '?'],
                                           scripted_rl()))(
      [[1], [1]], [[2], [3]], ['a', 'b'], ['x', 'y'], counts)
  assert fields == [{'judge_score': 0.5}, {'judge_score': -0.5}]
  assert counts == {'judge_malformed': 1}
  sample = rewards.Sample('a', 'x', '', 1, 4, False, **fields[0])
  assert rewards.judge(sample) == 0.5


def test_a_run_graded_by_a_judge(trained_sft, tmp_path):
  """A trained SFT workdir (an adder) judges GRPO's samples through a
  template that ends with the sample's prompt (`a+b=`), on a scale of
  1,000: every sample's reward is the judge's answer over 1,000, or the
  malformed reward (-1) for an answer with no number (or over 1,000); the
  malformed ones are counted, equal samples score alike (the judge is
  greedy), and the scores follow the prompts the judge reads. (The
  scale leaves room for any number the adder writes after a random
  policy's text, which varies with the machine that trained it: on a
  scale of 100 a model trained elsewhere scored 7 of 128 samples.)"""
  result, judge_dir = trained_sft
  assert result.returncode == 0, result.stderr[-3000:]
  result = helpers.run_main(
      '--config=tunix_pw/configs/grpo.py:runlocal', '--config.steps=2',
      '--config.rl.rewards=judge:1', f'--config.rl.judge={judge_dir}',
      '--config.rl.judge_template={completion}\n{prompt}',
      '--config.rl.judge_scale=1000', '--config.rl.judge_malformed=-1',
      '--config.eval_examples=0', '--config.sample_every=1',
      '--config.samples_per_log=8', f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  logged = [m for m in metrics.read(str(tmp_path)) if 'loss' in m]
  logs = [json.loads(line) for line in
          (tmp_path / 'samples.jsonl').read_text().splitlines()]
  assert [m['step'] for m in logged] == [1, 2]
  for m in logged:  # every prompt of the step logged: all 8 x 8 samples
    scores = np.array([s['rewards'] for s in logs if s['step'] == m['step']])
    assert scores.shape == (8, 8)
    valid = scores[scores != -1.0]
    assert ((valid >= 0) & (valid <= 1)).all(), scores
    np.testing.assert_allclose(valid * 1000, np.round(valid * 1000), atol=1e-3)
    assert m['judge_malformed'] == (scores == -1.0).sum()
    assert m['reward/judge'] == pytest.approx(scores.mean(), abs=1e-6)
  every = [(s['prompt'], c, r) for s in logs
           for c, r in zip(s['completions'], s['rewards'])]
  seen = {}
  for prompt, completion, reward in every:
    assert seen.setdefault((prompt, completion), reward) == reward, (
        prompt, completion, seen[prompt, completion], reward)
  scored = [r for _, _, r in every if r != -1.0]
  assert len(scored) >= 64, every  # the adder answers with a number
  # The judge reads the prompt: the prompts' commonest scores differ.
  commonest = {collections.Counter(s['rewards']).most_common(1)[0][0]
               for s in logs}
  assert len(commonest) >= 4, logs


def test_an_ask_over_the_judges_bound_is_not_read(trained_sft, tmp_path):
  """Asks longer than rl.judge_max_prompt_length tokens (here: every one)
  score the malformed reward and are counted, and the run goes on."""
  _, judge_dir = trained_sft
  result = helpers.run_main(
      '--config=tunix_pw/configs/grpo.py:runlocal', '--config.steps=1',
      '--config.rl.rewards=judge:1', f'--config.rl.judge={judge_dir}',
      '--config.rl.judge_max_prompt_length=8',
      '--config.rl.judge_malformed=-1', '--config.eval_examples=0',
      f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  [logged] = [m for m in metrics.read(str(tmp_path)) if 'loss' in m]
  assert logged['judge_malformed'] == 64
  assert logged['reward/judge'] == -1


@pytest.mark.parametrize('flags, says', [
    (['--config.rl.rewards=judge:1'], 'needs --config.rl.judge'),
    (['--config.rl.judge=/x'], 'needs --config.rl.judge'),
    (['--config.rl.rewards=judge:1', '--config.rl.judge=/x',
      '--config.rl.judge_template=Rate {completion}'],
     'judge_template needs a {prompt} field'),
    (['--config.rl.rewards=judge:1', '--config.rl.judge=/x',
      '--config.rl.judge_max_prompt_length=0'],
     'judge_max_prompt_length at least 1'),
])
def test_judge_config_errors(tmp_path, flags, says):
  result = helpers.run_main('--config=tunix_pw/configs/grpo.py:runlocal',
                            *flags, '--check_only', f'--workdir={tmp_path}')
  assert result.returncode == 2
  [line] = helpers.error_lines(result.stderr)
  assert says in line
