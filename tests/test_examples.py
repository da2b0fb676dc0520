"""examples/README.md's recipes, run as written on examples/tiny_checkpoint.py's
checkpoint for 2 steps with small batches: SFT with LoRA exported, GRPO
from that export exported again, then generate with it and evaluate it
(greedy and pass@k)."""

import json
import pathlib

from examples import tiny_checkpoint
from tests import helpers
from tests.test_doc_commands import commands

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The tiny variant: what each recipe's job adds to its command.
TINY = {
    'sft': ['--config.steps=2', '--config.batch_size=8',
            '--config.eval_examples=8', '--config.eval_batch_size=8',
            '--config.eval_max_new_tokens=16', '--config.data.max_length=128'],
    'grpo': ['--config.steps=2', '--config.rl.prompts_per_step=4',
             '--config.rl.num_generations=4', '--config.rl.mini_batch_size=16',
             '--config.rl.micro_batch_size=8',
             '--config.rl.logps_micro_batch_size=16',
             '--config.rl.max_new_tokens=16', '--config.rl.max_prompt_length=96',
             '--config.eval_examples=8', '--config.eval_batch_size=8'],
    'generate': ['--config.sampling.max_new_tokens=8'],
    'eval': ['--config.examples=8', '--config.batch_size=8',
             '--config.max_new_tokens=16', '--config.k=2', '--config.n=2'],
}


def test_sft_with_lora_then_grpo_then_generate_on_a_tiny_checkpoint(tmp_path):
  checkpoint = tmp_path / 'tiny-gemma2'
  tiny_checkpoint.save(str(checkpoint))
  recipe = [argv for where, argv in commands()
            if where.startswith('README.md') and any(
                'example_' in a for a in argv)]
  assert [a[0].split('/')[-1].split('.')[0] for a in recipe] == [
      'sft', 'grpo', 'generate', 'eval']
  for argv in recipe:
    job = argv[0].split('/')[-1].split('.')[0]
    argv = [a.replace('/ckpt/gemma-2-2b-it', str(checkpoint))
            .replace('/tmp/example_', f'{tmp_path}/example_') for a in argv]
    result = helpers.run_main(*argv, *TINY[job],
                              '--config.runtime.host_device_count=8')
    assert result.returncode == 0, (argv, result.stderr[-3000:])
    if job in ('sft', 'grpo'):
      assert f'{job}: held-out greedy exact match' in result.stdout
    elif job == 'generate':
      assert 'Ana has 3 pens' in result.stdout  # it shows its prompt
  for export in ('example_sft_hf', 'example_grpo_hf'):  # HF layout
    config = json.loads((tmp_path / export / 'config.json').read_text())
    assert config['model_type'] == 'gemma2', config
    assert (tmp_path / export / 'tokenizer.json').exists()
    assert (tmp_path / export / 'chat_template.jinja').exists()
  # eval, last: greedy accuracy and pass@2 of the GRPO export.
  written = json.loads((tmp_path / 'example_eval' / 'eval.json').read_text())
  assert {'accuracy', 'pass@2', 'maj@2'} <= set(written), written
  assert 'eval: gsm8k/test exact_match: accuracy' in result.stdout
