"""A real-checkpoint workflow through `main`: a Llama-architecture model
saved by transformers with a Llama 3 style tokenizer and chat template.
Our greedy tokens equal transformers' `generate(do_sample=False)`, from a
chat prompt and from a prompts file of messages; an SFT export loads in
transformers alone and generates what our `generate` does."""

import json
import time

import numpy as np
import pytest
import torch
import transformers

from tests import helpers
from tests.models import tiny_tokenizers as tiny

NEW_TOKENS = 24
QUESTION = 'What is the capital of France?'
MESSAGES = [{'role': 'system', 'content': 'Answer in one word.'},
            {'role': 'user', 'content': 'What is 12 + 30?'}]
GENERATE = '--config=tunix_pw/configs/generate.py:runlocal'


def greedy(model, ids: list[int], stops: list[int]) -> list[int]:
  """transformers' greedy tokens; fails unless every step's top-2 logits
  differ by more than 1e-3 (else float noise could pick either) and no stop
  token comes before NEW_TOKENS."""
  out = model.generate(torch.tensor([ids]), do_sample=False,
                       max_new_tokens=NEW_TOKENS, eos_token_id=stops,
                       pad_token_id=stops[0], output_logits=True,
                       return_dict_in_generate=True)
  tokens = out.sequences[0, len(ids):].tolist()
  top2 = [np.sort(step[0].numpy())[-2:] for step in out.logits]
  assert len(tokens) == NEW_TOKENS and not set(tokens) & set(stops)
  assert min(b - a for a, b in top2) > 1e-3
  return tokens


def make_checkpoint(directory: str, seed: int):
  """A random Llama with the llama3-style tokenizer beside its weights."""
  tiny.make('llama3', directory)
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  torch.manual_seed(seed)
  config = transformers.LlamaConfig(
      vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      max_position_embeddings=256, tie_word_embeddings=False,
      bos_token_id=tokenizer.bos_token_id,
      eos_token_id=tokenizer.eos_token_id)
  config._attn_implementation = 'eager'  # pylint: disable=protected-access
  model = transformers.AutoModelForCausalLM.from_config(
      config, torch_dtype=torch.float32).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn_like(p) * 0.3)
  model.save_pretrained(directory, safe_serialization=True)
  return model, tokenizer


def chat_ids(tokenizer, messages) -> list[int]:
  return list(tokenizer.apply_chat_template(
      messages, tokenize=True, add_generation_prompt=True, return_dict=False))


def references(model, tokenizer):
  stops = [tokenizer.eos_token_id]
  return [greedy(model, chat_ids(tokenizer, m), stops) for m in (
      [{'role': 'user', 'content': QUESTION}], MESSAGES)]


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
  """The first seed whose greedy decoding is unambiguous on both prompts."""
  for seed in range(20):
    directory = str(tmp_path_factory.mktemp(f'llama{seed}'))
    model, tokenizer = make_checkpoint(directory, seed)
    try:
      return directory, references(model, tokenizer)
    except AssertionError:
      continue
  raise AssertionError('no seed of 20 decodes unambiguously')


def generate(tmp_path, checkpoint_dir: str, *extra: str) -> list[list[int]]:
  (tmp_path / 'prompts.jsonl').write_text(json.dumps({'messages': MESSAGES}))
  out = []
  for source in (f'--config.prompt={QUESTION}',
                 f'--config.prompts_file={tmp_path / "prompts.jsonl"}'):
    result = helpers.run_main(
        GENERATE, f'--config.model.checkpoint={checkpoint_dir}', source,
        '--config.chat=True', f'--config.sampling.max_new_tokens={NEW_TOKENS}',
        f'--config.output_jsonl={tmp_path / "out.jsonl"}', *extra,
        f'--workdir={tmp_path / "w"}')
    assert result.returncode == 0, result.stderr
    [record] = [json.loads(line) for line in
                (tmp_path / 'out.jsonl').read_text().splitlines()]
    out.append(record['tokens'])
  return out


def test_greedy_tokens_equal_transformers(checkpoint, tmp_path):
  directory, expected = checkpoint
  assert generate(tmp_path, directory) == expected


def test_hostile_chat_template_exits_2_fast(checkpoint, tmp_path):
  directory, _ = checkpoint
  hostile = tmp_path / 'tokenizer'
  tiny.make('llama3', str(hostile))
  (hostile / 'chat_template.jinja').write_text(
      '{% for a in range(100000) %}{% for b in range(100000) %}'
      '{% for c in range(100000) %}{% endfor %}{% endfor %}{% endfor %}')
  start = time.monotonic()
  result = helpers.run_main(
      GENERATE, f'--config.model.checkpoint={directory}',
      f'--config.model.tokenizer={hostile}', '--config.prompt=hi',
      '--config.chat=True', f'--workdir={tmp_path / "w"}', timeout=60)
  assert time.monotonic() - start < 10  # the whole command
  assert result.returncode == 2, result.stderr
  [line] = helpers.error_lines(result.stderr)
  assert 'chat_template.jinja: the chat template failed to render' in line
  assert 'Traceback' not in result.stderr


EXPORTS = {
    'sft': ['--config.batch_size=16', '--config.data.max_length=24',
            '--config.eval_examples=0'],
    'dpo': ['--config.batch_size=8', '--config.data.max_length=24',
            '--config.eval_batch_size=8'],
    # Partial credit: a random model's completions then score differently
    # (all-wrong groups have no advantage, and nothing would change).
    'grpo': ['--config.rl.prompts_per_step=4', '--config.rl.num_generations=2',
             '--config.rl.mini_batch_size=8', '--config.rl.micro_batch_size=8',
             '--config.rl.logps_micro_batch_size=8',
             '--config.rl.rewards=digits:1.0,format:0.1,overlong:0.5',
             '--config.rl.max_new_tokens=4', '--config.eval_examples=0',
             '--config.checkpoint.every=0'],
}


@pytest.mark.parametrize('job', sorted(EXPORTS))
def test_export_loads_alone_in_transformers(checkpoint, tmp_path, job):
  """Weights and tokenizer files side by side: transformers loads the
  export alone, and (SFT) greedy-decodes exactly what our generate does."""
  directory, _ = checkpoint
  export = tmp_path / 'export'
  result = helpers.run_main(
      f'--config=tunix_pw/configs/{job}.py:runlocal',
      f'--config.model.checkpoint={directory}', '--config.steps=3',
      '--config.data.arithmetic.train_size=64',
      '--config.data.arithmetic.test_size=16', *EXPORTS[job],
      f'--config.export={export}', f'--workdir={tmp_path / job}')
  assert result.returncode == 0, result.stderr[-3000:]
  assert {p.name for p in export.iterdir()} == {
      'config.json', 'model.safetensors', 'tokenizer.json',
      'tokenizer_config.json', 'chat_template.jinja'}
  model = transformers.AutoModelForCausalLM.from_pretrained(
      str(export), torch_dtype=torch.float32).eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(export))
  assert chat_ids(tokenizer, MESSAGES) == chat_ids(
      transformers.AutoTokenizer.from_pretrained(directory), MESSAGES)
  original = transformers.AutoModelForCausalLM.from_pretrained(directory)
  assert not torch.equal(model.lm_head.weight, original.lm_head.weight)
  if job == 'sft':
    assert generate(tmp_path, str(export)) == references(model, tokenizer)
