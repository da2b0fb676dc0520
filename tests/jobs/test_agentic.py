"""The agentic pipeline through main, as a user runs it: an SFT warm-up on
demonstration episodes, then agentic GRPO with the calculator tool played
by the tiny model through the sampler."""

import json

import pytest

from tests import helpers
from tunix_pw.train import metrics

PULSE = ['--config=tunix_pw/configs/agentic.py:runlocal',
         '--config.sft.steps=6', '--config.sft.batch_size=8',
         '--config.sft.eval_examples=8', '--config.sft.eval_batch_size=8',
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
  result = helpers.run_main(*PULSE, f'--workdir={tmp_path}', timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  logged = metrics.read(str(tmp_path / 'agentic'))
  steps = [m for m in logged if 'loss' in m]
  assert [m['step'] for m in steps] == [1, 2]
  for m in steps:  # 8 episodes a step, each turn counted
    assert m['model_turns'] >= 8 and m['generate_calls'] >= 2
    assert 0 <= m['well_formed_calls'] <= 1 and m['weight'] > 0
  evals = [m for m in logged if 'eval/accuracy' in m]
  assert [m['step'] for m in evals] == [0, 2]
  assert all(m['eval/total'] == 8 for m in evals)
  # The warm-up taught the call format: the model calls the calculator.
  assert evals[0]['eval/tool_calls'] > 0
  with open(tmp_path / 'agentic' / 'samples.jsonl') as f:
    sample = json.loads(f.readline())
  assert "calculator(expression='" in sample['completions'][0]
  assert 'after sft: held-out accuracy' in result.stdout  # on episodes
  assert 'after agentic: held-out accuracy' in result.stdout


@pytest.mark.parametrize('flag,message', [
    ('--config.agentic.agent.env=maze', "env='maze' is not a registered"),
    ('--config.agentic.agent.call_format=xml', 'call_format'),
    ('--config.agentic.agent.tools=calculator,shell', "'shell', not a "),
    ('--config.agentic.agent.tool_timeout=0', 'tool_timeout=0'),
    ('--config.agentic.rl.dynamic_sampling=true', 'dynamic_sampling'),
])
def test_bad_agent_settings_are_one_line_errors(tmp_path, flag, message):
  result = helpers.run_main(*PULSE, flag, f'--workdir={tmp_path}')
  assert result.returncode == 2, result.stderr[-2000:]
  [line] = helpers.error_lines(result.stderr)
  assert message in line
  assert not (tmp_path / 'agentic').exists()
