"""The agentic pipeline through main, as a user runs it: an SFT warm-up on
demonstration episodes, then agentic GRPO with the calculator tool played
by the tiny model through the sampler."""

import json
import shutil

import pytest

from tests import helpers
from tunix_pw.configs import agentic
from tunix_pw.errors import UsageError
from tunix_pw.jobs import pipeline
from tunix_pw.train import metrics

PULSE = ['--config=tunix_pw/configs/agentic.py:runlocal',
         '--config.sft.steps=60', '--config.sft.batch_size=16',
         '--config.sft.optimizer.learning_rate=3e-3',
         '--config.sft.eval_examples=8', '--config.sft.eval_batch_size=8',
         '--config.sft.eval_every=60',  # evaluated once, at the end
         '--config.agentic.steps=2', '--config.agentic.eval_examples=8',
         '--config.agentic.eval_batch_size=8',
         '--config.agentic.rl.prompts_per_step=2',
         '--config.agentic.rl.num_generations=4',
         '--config.agentic.rl.mini_batch_size=8',
         '--config.agentic.rl.micro_batch_size=4',
         '--config.agentic.rl.logps_micro_batch_size=8',
         '--config.agentic.sample_every=1',
         '--config.agentic.agent.max_turns=2']


def test_warm_up_then_agentic_steps(tmp_path):
  """With two attempts, every training episode practising from a wrong
  first answer (scripted: the calculator called, its result misquoted);
  episodes collected asynchronously, up to one step ahead."""
  result = helpers.run_main(*PULSE, '--config.agentic.agent.max_turns=4',
                            '--config.agentic.agent.attempts=2',
                            '--config.agentic.agent.practice=1.0',
                            '--config.agentic.rl.max_prompt_length=384',
                            '--config.agentic.rl.max_staleness=1',
                            f'--workdir={tmp_path}', timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  logged = metrics.read(str(tmp_path / 'agentic'))
  steps = [m for m in logged if 'loss' in m]
  assert [m['step'] for m in steps] == [1, 2]
  for m in steps:  # 8 episodes a step, each turn counted
    assert m['model_turns'] >= 8 and m['generate_calls'] >= 1
    assert 0 <= m['well_formed_calls'] <= 1 and m['weight'] > 0
    assert m['practice_starts'] == 8 and m['wrong_answers'] >= 8
    assert 'over_budget' not in m
    assert m['staleness'] <= 1 and m['time/trainer_wait'] >= 0
  evals = [m for m in logged if 'eval/accuracy' in m]
  assert [m['step'] for m in evals] == [0, 2]
  assert all(m['eval/total'] == 8 and 'eval/practice_starts' not in m
             for m in evals)  # held-out episodes never practise
  # The warm-up taught the call format: the model calls the calculator.
  assert evals[0]['eval/tool_calls'] > 0
  with open(tmp_path / 'agentic' / 'samples.jsonl') as f:
    sample = json.loads(f.readline())
  assert "calculator(expression='" in sample['completions'][0]
  assert 'after sft: held-out accuracy' in result.stdout  # on episodes
  assert 'after agentic: held-out accuracy' in result.stdout


@pytest.mark.parametrize('field,value,message', [
    ('env', 'maze', "env='maze' is not a registered"),
    ('call_format', 'xml', 'call_format'),
    ('tools', 'calculator,shell', "'shell', not a "),
    ('tool_timeout', 0.0, 'tool_timeout=0'),
    ('attempts', 9, 'attempts=9 must be from 1 to'),
    ('practice', 0.5, 'practice=0.5 must be from 0 to 1, and above 0 only'),
])
def test_bad_agent_settings_are_config_errors(field, value, message):
  config = agentic.get_config('runlocal')
  config.agentic.agent[field] = value
  with pytest.raises(UsageError, match=message):
    pipeline.validate(config)


def test_episodes_are_not_grown_as_trees():
  config = agentic.get_config('runlocal')
  config.agentic.rl.tree.chains = 2
  with pytest.raises(UsageError, match='--config.rl.tree'):
    pipeline.validate(config)


def test_a_bad_setting_stops_main_before_any_work(tmp_path):
  result = helpers.run_main(*PULSE, '--config.agentic.rl.dynamic_sampling=true',
                            f'--workdir={tmp_path}')
  assert result.returncode == 2, result.stderr[-2000:]
  [line] = helpers.error_lines(result.stderr)
  assert 'dynamic_sampling' in line
  assert not (tmp_path / 'sft').exists()


@pytest.mark.skipif(shutil.which('bwrap') is None,
                    reason='bubblewrap is not installed (.ci/run installs it)')
def test_the_code_task_runs_tests_in_the_sandbox(tmp_path):
  for split, count in (('train', 8), ('test', 4)):
    with open(tmp_path / f'{split}.jsonl', 'w') as f:
      for a in range(2, 2 + count):
        f.write(json.dumps(dict(
            question=f'f(x)={a}*x+1', answer=f'def f(x):\n  return {a}*x+1',
            tests=[dict(call=f'f({x})', expected=str(a * x + 1))
                   for x in (0, 3)])) + '\n')
  result = helpers.run_main(
      '--config=tunix_pw/configs/agentic.py:runlocal,code',
      *[p for p in PULSE[1:] if 'max_turns' not in p],
      f'--config.sft.data.manual_dir={tmp_path}',
      f'--config.agentic.data.manual_dir={tmp_path}',
      '--config.sft.eval_examples=4', '--config.agentic.eval_examples=4',
      '--config.sft.steps=10',  # the sandbox checks answers, right or not
      f'--workdir={tmp_path / "run"}', timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  steps = [m for m in metrics.read(str(tmp_path / 'run' / 'agentic'))
           if 'loss' in m]
  # Every episode's answer ran its two tests in the sandbox.
  assert all(m.get('tests', 0) == 2 * m.get('answers', 0) > 0 for m in steps)
  assert all(0 <= m.get('tests_passed', 0) <= m['tests'] for m in steps)
