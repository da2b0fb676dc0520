"""The generate job through main: prompts in, completions and JSONL out;
bad input exits 2 naming the problem."""

import json

from flax import nnx
import pytest

from tests import helpers
from tunix_pw.models import checkpoints, hf, presets

CONFIG = '--config=tunix_pw/configs/generate.py:runlocal'


def test_prompts_file_to_jsonl(tmp_path):
  prompts = tmp_path / 'prompts.jsonl'
  prompts.write_text(
      json.dumps({'prompt': 'What is 2+2?'}) + '\n' +
      json.dumps({'messages': [{'role': 'user', 'content': 'Hi'}]}) + '\n')
  out = tmp_path / 'out.jsonl'
  result = helpers.run_main(CONFIG, f'--config.prompts_file={prompts}',
                            f'--config.output_jsonl={out}',
                            '--config.sampling.max_new_tokens=6',
                            f'--workdir={tmp_path / "w"}')
  assert result.returncode == 0, result.stderr
  records = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r['prompt'] for r in records] == ['What is 2+2?', 'user: Hi\nmodel: ']
  for r in records:
    assert len(r['tokens']) == len(r['logprobs']) <= 6
    assert all(lp <= 0 for lp in r['logprobs'])
  assert "=== 0: 'What is 2+2?'" in result.stdout


def test_generates_from_a_checkpoint_directory(tmp_path):
  cfg = presets.PRESETS['tiny-llama3']
  model = checkpoints.init(cfg, seed=3)
  hf.save(str(tmp_path / 'ckpt'), cfg, nnx.state(model))
  result = helpers.run_main(
      CONFIG, f'--config.model.checkpoint={tmp_path / "ckpt"}',
      '--config.model.tokenizer=char', '--config.prompt=12+30=',
      '--config.sampling.max_new_tokens=4', '--config.sampling.temperature=0.7',
      '--config.sampling.top_k=5', f'--workdir={tmp_path / "w"}')
  assert result.returncode == 0, result.stderr
  assert "=== 0: '12+30='" in result.stdout


@pytest.mark.parametrize('extra, lines, message', [
    ([], ['ok', '', 'fine'], 'prompts.txt:2: empty prompt'),
    ([], ['{"prompt": "a"}', '{not json'], 'prompts.jsonl:2: not JSON'),
    ([], ['{"prompt": 5}'], 'prompts.jsonl:1: not a JSON object with a '
     'string "prompt"'),
    ([], ['{"prompt": "a"}', '["a"]'], 'prompts.jsonl:2: not a JSON object'),
    ([], ['{"messages": "hi"}'], 'prompts.jsonl:1: not a JSON object'),
    ([], ['{"messages": [{"role": "user"}]}'], 'prompts.jsonl:1: not a JSON '
     'object'),
    ([], ['{"messages": [{"role": "user", "content": ["a"]}]}'],
     'prompts.jsonl:1: not a JSON object'),
    ([], ['{"messages": []}'], 'prompts.jsonl:1: not a JSON object'),
    (['--config.sampling.top_p=1.5'], ['ok'], 'top_p=1.5 must be in (0, 1]'),
    (['--config.sampling.max_new_tokens=0'], ['ok'],
     'max_new_tokens=0 must be at least 1'),
    (['--config.sampling.max_cache=16'], ['x' * 20],
     'exceeds the cache of 16 positions'),
])
def test_bad_input_exits_2(tmp_path, extra, lines, message):
  name = 'prompts.jsonl' if lines[0].startswith('{') else 'prompts.txt'
  (tmp_path / name).write_text('\n'.join(lines) + '\n')
  result = helpers.run_main(CONFIG, f'--config.prompts_file={tmp_path / name}',
                            *extra, f'--workdir={tmp_path / "w"}')
  assert result.returncode == 2, result.stderr
  [line] = helpers.error_lines(result.stderr)
  assert message in line
