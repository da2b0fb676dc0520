"""The reward model: the Bradley-Terry loss by hand, its export read by
transformers' AutoModelForSequenceClassification with equal scores (every
family), the job through main, pairs from a trained model's samples, and
GRPO scoring its samples with a reward model."""

import json

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from tests import helpers
from tests.models import hf_models
from tunix_pw.configs import grpo as grpo_config
from tunix_pw.models import checkpoints, hf, presets, value
from tunix_pw.rl import reward_model
from tunix_pw.runtime import meshes
from tunix_pw.train import losses, metrics


def test_bradley_terry_loss():
  # Bradley & Terry (1952); Ouyang et al. 2022 (arXiv 2203.02155), eq. 1:
  # loss = -log sigmoid(r(x, y_c) - r(x, y_r)).
  chosen, rejected = jnp.array([2.0, 0.0, -1.0]), jnp.array([1.0, 0.0, 1.0])
  d = np.array([1.0, 0.0, -2.0])
  np.testing.assert_allclose(losses.bradley_terry(chosen, rejected),
                             np.log1p(np.exp(-d)), rtol=1e-6)


def scores_ours(model, tokens, lengths):
  segments = (np.arange(tokens.shape[1]) < lengths[:, None]).astype(np.int32)
  positions = np.arange(tokens.shape[1])[None] * segments
  values = model(jnp.asarray(tokens), jnp.asarray(positions),
                 jnp.asarray(segments))
  return np.asarray(value.last_token(values, jnp.asarray(segments)))


@pytest.mark.parametrize('family', sorted(hf_models.CONFIGS))
def test_export_gives_transformers_the_same_scores(tmp_path, family):
  hf_models.make(family, str(tmp_path / 'lm'))
  decoder, cfg = checkpoints.load(str(tmp_path / 'lm'))
  model = value.from_decoder(decoder, seed=0)
  model.score.set_value(jax.random.normal(jax.random.key(1), (cfg.embed_dim,
                                                             1)) * 0.3)
  hf.save(str(tmp_path / 'rm'), cfg, nnx.state(model), classifier_pad_id=0)
  theirs = transformers.AutoModelForSequenceClassification.from_pretrained(
      str(tmp_path / 'rm'), torch_dtype=torch.float32,
      attn_implementation='eager').eval()
  rng = np.random.default_rng(0)
  lengths = np.array([hf_models.SEQ, 7, 3])
  tokens = rng.integers(1, cfg.vocab_size, (3, hf_models.SEQ))
  tokens[np.arange(hf_models.SEQ)[None] >= lengths[:, None]] = 0  # padding
  with torch.no_grad():
    expected = theirs(input_ids=torch.tensor(tokens),
                      attention_mask=torch.tensor(tokens > 0)).logits[:, 0]
  np.testing.assert_allclose(scores_ours(model, tokens, lengths),
                             expected.numpy(), atol=1e-4, rtol=1e-4)
  assert json.loads((tmp_path / 'rm' / 'config.json').read_text())[
      'num_labels'] == 1


def test_the_job_trains_evaluates_and_exports(tmp_path):
  """On 32 pairs (one batch, every step), at a constant 3e-3: the loss
  starts at log 2 (the head starts at 0, every margin 0) and Bradley-Terry
  fits the batch, each chosen sequence scoring over its rejected one."""
  result = helpers.run_main(
      '--config=tunix_pw/configs/reward_model.py:runlocal', '--config.steps=10',
      '--config.log_every=1', '--config.data.train_examples=32',
      '--config.optimizer.learning_rate=3e-3',
      '--config.optimizer.warmup_steps=0',
      '--config.optimizer.schedule=constant',
      f'--config.export={tmp_path / "hf"}', f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  logged = [json.loads(line) for line in
            (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  steps = [m for m in logged if 'loss' in m]
  assert [m['step'] for m in steps] == list(range(1, 11))
  assert steps[0]['loss'] == pytest.approx(np.log(2), abs=1e-4)
  assert steps[0]['margin'] == pytest.approx(0, abs=1e-4)
  # Measured: 0.069, every pair right, a mean margin of 3.9.
  assert steps[-1]['loss'] < 0.5 * np.log(2), steps
  assert steps[-1]['accuracy'] >= 0.75 and steps[-1]['margin'] > 0.5, steps
  assert logged[-1]['eval/pairs'] == 1000
  assert 'held-out pairwise accuracy' in result.stdout
  model = transformers.AutoModelForSequenceClassification.from_pretrained(
      str(tmp_path / 'hf'))
  assert model.config.num_labels == 1


def test_pairs_from_a_trained_model_train_a_reward_model(trained_sft,
                                                        tmp_path):
  """The pairs job samples the SFT model (right about 80% of the time
  greedily, less at temperature 1): every pair's chosen completion is the
  right sum and its rejected one wrong; the reward model then trains on
  them from the same checkpoint."""
  result, sft = trained_sft
  assert result.returncode == 0, result.stderr[-3000:]
  pairs_dir = tmp_path / 'pairs'
  result = helpers.run_main(
      '--config=tunix_pw/configs/pairs.py:runlocal',
      f'--config.model.checkpoint={sft}', '--config.train_prompts=256',
      '--config.test_prompts=128', f'--config.output_dir={pairs_dir}',
      f'--workdir={tmp_path / "job"}')
  assert result.returncode == 0, result.stderr[-3000:]
  for split in ('train', 'test'):
    rows = [json.loads(line) for line in
            (pairs_dir / f'{split}.jsonl').read_text().splitlines()]
    assert len(rows) >= 5, split
    for row in rows:
      a, b = row['prompt'].rstrip('=').split('+')
      assert row['chosen'].strip() == str(int(a) + int(b)), row
      assert row['rejected'].strip() != str(int(a) + int(b)), row
  result = helpers.run_main(
      '--config=tunix_pw/configs/reward_model.py:runlocal',
      f'--config.model.checkpoint={sft}', '--config.data.name=preferences',
      f'--config.data.manual_dir={pairs_dir}', '--config.steps=4',
      '--config.batch_size=8', '--config.eval_batch_size=4',
      f'--workdir={tmp_path / "rm"}')
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'held-out pairwise accuracy' in result.stdout


def test_unpaired_records_from_a_trained_model_train_kto(trained_sft,
                                                         tmp_path):
  """format=unpaired labels every distinct sample of every prompt, right
  or wrong (prompts whose samples all agree too); KTO trains on them and is
  evaluated on the pairs their test split holds."""
  result, sft = trained_sft
  assert result.returncode == 0, result.stderr[-3000:]
  out = tmp_path / 'unpaired'
  result = helpers.run_main(
      '--config=tunix_pw/configs/pairs.py:runlocal', '--config.format=unpaired',
      f'--config.model.checkpoint={sft}', '--config.train_prompts=64',
      '--config.test_prompts=256', f'--config.output_dir={out}',
      f'--workdir={tmp_path / "job"}')
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [json.loads(line) for line in
          (out / 'train.jsonl').read_text().splitlines()]
  by_prompt = {}
  for row in rows:
    a, b = row['prompt'].rstrip('=').split('+')
    assert row['label'] == (row['completion'].strip() == str(int(a) + int(b)))
    by_prompt.setdefault(row['prompt'], []).append(row['completion'])
  assert len(by_prompt) == 64  # every prompt, all right or all wrong too
  assert all(len(set(c)) == len(c) for c in by_prompt.values())
  assert {True, False} <= {r['label'] for r in rows}
  # Its first 8 records, every step, from the first: the policy starts as
  # its reference (every example at the reference point: the loss is 1/2)
  # and one step on them lowers their loss (measured: 0.45).
  result = helpers.run_main(
      '--config=tunix_pw/configs/dpo.py:runlocal', '--config.dpo.algorithm=kto',
      f'--config.model.checkpoint={sft}', '--config.data.name=unpaired',
      f'--config.data.manual_dir={out}', '--config.steps=2',
      '--config.data.train_examples=8', '--config.optimizer.warmup_steps=0',
      '--config.log_every=1', '--config.eval_batch_size=2',
      '--config.batch_size=8', f'--workdir={tmp_path / "kto"}')
  assert result.returncode == 0, result.stderr[-3000:]
  logged = metrics.read(str(tmp_path / 'kto'))
  steps = [m for m in logged if 'loss' in m]
  assert [m['step'] for m in steps] == [1, 2]
  assert steps[0]['loss'] == pytest.approx(0.5, abs=1e-3)
  assert steps[1]['loss'] < steps[0]['loss'] - 0.01, steps
  # Held out: each test prompt's first right sample over its first wrong.
  test = [json.loads(line) for line in
          (out / 'test.jsonl').read_text().splitlines()]
  mixed = {r['prompt'] for r in test if r['label']} & {
      r['prompt'] for r in test if not r['label']}
  assert len(mixed) >= 2  # the model is right most of the time
  assert logged[-1]['eval/pairs'] == len(mixed) // 2 * 2
  assert 'held-out pairwise accuracy' in result.stdout


def test_pairs_from_a_model_never_right_write_nothing(tmp_path):
  result = helpers.run_main(
      '--config=tunix_pw/configs/pairs.py:runlocal',
      '--config.train_prompts=16', '--config.test_prompts=16',
      f'--config.output_dir={tmp_path / "pairs"}', f'--workdir={tmp_path}')
  assert result.returncode == 2
  [line] = helpers.error_lines(result.stderr)
  assert 'no prompt of the train split had both' in line
  assert not (tmp_path / 'pairs').exists()


@pytest.fixture
def random_reward_model(tmp_path):
  """An exported reward model on the :runlocal policy's architecture, with
  a random head (its scores vary between samples)."""
  decoder = checkpoints.init(presets.PRESETS['tiny-gemma'], seed=3)
  model = value.from_decoder(decoder, seed=0)
  model.score.set_value(jax.random.normal(
      jax.random.key(2), (decoder.cfg.embed_dim, 1)))
  hf.save(str(tmp_path / 'rm'), decoder.cfg, nnx.state(model),
          classifier_pad_id=0)
  return model, str(tmp_path / 'rm')


def test_the_scorer_scores_each_sequence_alone(random_reward_model):
  model, directory = random_reward_model
  config = grpo_config.get_config('runlocal')
  config.rl.reward_model = directory
  scores = reward_model.scorer(config, meshes.build(config.meshes,
                                                    jax.devices()))
  rng = np.random.default_rng(0)
  sequences = [list(rng.integers(3, 40, n)) for n in
               rng.integers(2, 18, config.rl.prompts_per_step *
                            config.rl.num_generations)]
  got = scores(sequences)
  for i in (0, 5, len(sequences) - 1):
    alone = np.asarray([sequences[i]])
    expected = scores_ours(model, alone, np.array([alone.shape[1]]))
    np.testing.assert_allclose(got[i], expected[0], rtol=1e-5, atol=1e-5)


def test_grpo_trains_on_a_reward_model_mixed_with_a_rule(
    random_reward_model, tmp_path):
  _, directory = random_reward_model
  result = helpers.run_main(
      '--config=tunix_pw/configs/grpo.py:runlocal', '--config.steps=2',
      '--config.eval_examples=0', '--config.checkpoint.every=0',
      f'--config.rl.reward_model={directory}',
      '--config.rl.rewards=reward_model:1,format:0.5', f'--workdir={tmp_path}')
  assert result.returncode == 0, result.stderr[-3000:]
  last = [m for m in metrics.read(str(tmp_path)) if 'loss' in m][-1]
  assert last['reward_std'] > 0
  np.testing.assert_allclose(
      last['reward_mean'],
      last['reward/reward_model'] + 0.5 * last['reward/format'], rtol=1e-5)


@pytest.mark.parametrize('flags,says', [
    (['--config.rl.rewards=reward_model:1'], 'needs --config.rl.reward_model'),
    (['--config.rl.reward_model=/nonexistent'], 'needs --config.rl.reward_model'),
    (['--config.rl.rewards=reward_model:1',
      '--config.rl.reward_model=/nonexistent'], 'does not exist')])
def test_reward_model_config_errors(tmp_path, flags, says):
  result = helpers.run_main('--config=tunix_pw/configs/grpo.py:runlocal',
                            *flags, '--check_only', f'--workdir={tmp_path}')
  assert result.returncode == 2
  [line] = helpers.error_lines(result.stderr)
  assert says in line
