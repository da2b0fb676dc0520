"""examples/README.md's recipes, run as written on examples/tiny_checkpoint.py's
checkpoint for 2 steps with small batches: SFT with LoRA exported, GRPO
from that export exported again, then generate with it and evaluate it
(greedy and pass@k); a reward model then PPO; offline then on-policy
distillation; agentic tool use; the XPK launch rendered."""

import json
import os
import pathlib
import re
import subprocess
import sys

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
    'reward_model': ['--config.steps=2', '--config.batch_size=8',
                     '--config.eval_batch_size=8',
                     '--config.data.max_length=128'],
}
TINY['distill'] = TINY['sft']
TINY['ppo'] = TINY['grpo'] + ['--config.rl.num_generations=1',
                              '--config.rl.prompts_per_step=8',
                              '--config.rl.mini_batch_size=8',
                              '--config.rl.logps_micro_batch_size=8']
TINY['agentic'] = TINY['grpo'] + ['--config.agent.max_turns=2',
                                  '--config.rl.max_prompt_length=320']


def recipe(*workdirs: str) -> list[list[str]]:
  """The README commands whose workdirs are /tmp/example_<name>, in order."""
  return [argv for where, argv in commands()
          if where.startswith('examples/README.md') and any(
              a in (f'--workdir=/tmp/example_{w}' for w in workdirs)
              for a in argv)]


def test_sft_with_lora_then_grpo_then_generate_on_a_tiny_checkpoint(tmp_path):
  checkpoint = tmp_path / 'tiny-gemma2'
  tiny_checkpoint.save(str(checkpoint))
  first = recipe('sft', 'grpo', 'generate', 'eval')
  assert [a[0].split('/')[-1].split('.')[0] for a in first] == [
      'sft', 'grpo', 'generate', 'eval']
  for argv in first:
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


def test_the_other_recipes_run_on_a_tiny_checkpoint(tmp_path):
  """The reward model and PPO, both distillations and the agentic run,
  each for 2 steps with the tiny checkpoint as every model (the SFT
  export, the student and the teacher); then the XPK launch rendered."""
  checkpoint = tmp_path / 'tiny-gemma2'
  tiny_checkpoint.save(str(checkpoint))
  runs = recipe('rm', 'ppo', 'distill', 'opd', 'agentic')
  assert [a[0].split('/')[-1] for a in runs] == [
      'reward_model.py:gemma2-2b', 'ppo.py:gemma2-2b', 'distill.py:gemma2-2b',
      'grpo.py:gemma2-2b,distill', 'agentic.py:gemma2-2b']
  for argv in runs:
    job = argv[0].split('/')[-1].split('.')[0]
    argv = [re.sub(r'/ckpt/gemma-2-\w+-it|/tmp/example_sft_hf',
                   str(checkpoint), a)
            .replace('/tmp/example_', f'{tmp_path}/example_') for a in argv]
    result = helpers.run_main(*argv, *TINY[job],
                              '--config.runtime.host_device_count=8')
    assert result.returncode == 0, (argv, result.stderr[-3000:])
    assert re.search(r'held-out (greedy exact match|pairwise accuracy)',
                     result.stdout), result.stdout[-2000:]
  config = json.loads((tmp_path / 'example_rm_hf' / 'config.json')
                      .read_text())
  assert config['architectures'] == ['Gemma2ForSequenceClassification']
  [launch] = [' '.join(line.split()) for line in re.sub(
      r'\\\n', ' ', (ROOT / 'examples/README.md').read_text()).splitlines()
              if line.startswith('python launch/xpk.py')]
  bin_dir = os.path.dirname(sys.executable)
  result = subprocess.run(launch, shell=True, cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(
                              os.environ, HOME=str(tmp_path),
                              PATH=f'{bin_dir}:{os.environ["PATH"]}'))
  assert result.returncode == 0, result.stderr[-2000:]
  assert re.search(r'^manifest: ', result.stdout, re.M)
