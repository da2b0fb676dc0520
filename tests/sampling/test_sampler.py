"""The KV-cache sampler: exactness against the full forward pass, padding
invariance, sampling statistics, logprobs, compilation counts, sharding,
stops, and weight updates."""

import collections
import dataclasses
import functools
import re

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import numpy as np
import psutil
import pytest
from scipy import stats

from tests.models import hf_models
from tunix_pw.configs import common
from tunix_pw.errors import UsageError
from tunix_pw.models import checkpoints, presets
from tunix_pw.models.decoder import Cache
from tunix_pw.rl import loss
from tunix_pw.sampling import rules
from tunix_pw.sampling.rollout import SamplingConfig
from tunix_pw.sampling.sampler import Sampler

PROMPTS = [[5, 17, 33, 2, 40, 41, 7], [9, 10], [60, 61, 62, 63, 64, 65, 66,
                                                 67, 68, 69, 70, 71, 72, 73]]


@pytest.fixture(scope='module')
def models(tmp_path_factory):
  """A tiny Gemma 2 with random weights large enough to vary its output:
  ours, and transformers' that wrote it."""
  directory = tmp_path_factory.mktemp('gemma2')
  torch_model = hf_models.make('gemma2', str(directory))
  return checkpoints.load(str(directory))[0], torch_model


@pytest.fixture(scope='module')
def model(models):
  return models[0]


@jax.jit
def _forward(model, tokens):
  logits, _ = model(tokens, jnp.arange(tokens.shape[1])[None],
                    jnp.ones_like(tokens))
  return logits[0]


def full_logits(model, sequence):
  """The full forward pass; right padding to 64 keeps one compilation (a
  causal model's logits do not see later tokens)."""
  tokens = np.zeros((1, 64), np.int32)
  tokens[0, :len(sequence)] = sequence
  return np.asarray(_forward(model, tokens))[:len(sequence)]


def test_greedy_equals_stepwise_argmax_of_the_full_forward(model):
  sampler = Sampler(model, pad_id=0, eos_ids=())
  out = sampler.generate(PROMPTS, SamplingConfig(max_new_tokens=10,
                                                 greedy=True))
  for row, prompt in enumerate(PROMPTS):
    sequence = list(prompt)
    for _ in range(10):
      sequence.append(int(np.argmax(full_logits(model, sequence)[-1])))
    assert np.asarray(out.tokens[row]).tolist() == sequence[len(prompt):]
  assert len(set(np.asarray(out.tokens).ravel().tolist())) > 3  # not trivial


@pytest.mark.parametrize('temperature, top_p', [(0.5, 1.0), (0.8, 0.9),
                                                  (1.0, 1.0)])
def test_logprobs_are_the_policy_at_the_temperature(models, temperature,
                                                     top_p):
  """The recorded log-probability of each sampled token is that of
  softmax(logits / T) (before top-p): transformers' logits over T within
  1e-4, and the trainer's log-probabilities of the same sequences (the
  old policy's, rl/loss.py) within 1e-5; the mass top-p kept is the
  nucleus of transformers' softmax(logits / T)."""
  model, torch_model = models
  sampler = Sampler(model, pad_id=0, eos_ids=())
  out = sampler.generate(PROMPTS, SamplingConfig(
      max_new_tokens=8, temperature=temperature, top_p=top_p, seed=7))
  for row, prompt in enumerate(PROMPTS):
    generated = np.asarray(out.tokens[row]).tolist()
    sequence = np.array([prompt + generated])
    theirs = hf_models.logits(torch_model, sequence, np.ones_like(sequence),
                              np.arange(sequence.shape[1])[None])[0]
    logp = jax.nn.log_softmax(theirs[len(prompt) - 1:-1] / temperature, -1)
    expected = np.take_along_axis(np.asarray(logp),
                                  np.array(generated)[:, None], -1)[:, 0]
    recorded = np.asarray(out.logprobs[row])
    np.testing.assert_allclose(recorded, expected, atol=1e-4)
    probs = np.sort(np.exp(np.asarray(logp, np.float64)), -1)[:, ::-1]
    # The fewest best tokens reaching top_p (no ties among these logits).
    kept = np.array([p[:np.searchsorted(np.cumsum(p), top_p - 1e-6) + 1].sum()
                     for p in probs])
    np.testing.assert_allclose(np.asarray(out.log_kept[row]),
                               np.log(np.minimum(kept, 1.0)), atol=1e-4)
    trainer = loss.token_logps(
        model, jnp.asarray(sequence), jnp.arange(sequence.shape[1])[None],
        jnp.ones_like(sequence), temperature=temperature)[0]
    np.testing.assert_allclose(
        recorded, np.asarray(trainer[0, len(prompt) - 1:]), atol=1e-5)


def test_a_prompt_alone_and_in_a_padded_batch_agree(model):
  sampler = Sampler(model, pad_id=0, eos_ids=())
  greedy = SamplingConfig(max_new_tokens=12, greedy=True)
  batch = sampler.generate(PROMPTS + [list(range(3, 40))], greedy)
  for row, prompt in enumerate(PROMPTS):
    alone = sampler.generate([prompt], greedy)
    np.testing.assert_array_equal(alone.tokens[0], batch.tokens[row])
    np.testing.assert_allclose(alone.logprobs[0], batch.logprobs[row],
                               atol=1e-5, rtol=0)


def test_compiles_once_per_bucket(model):
  sampler = Sampler(model, pad_id=0, eos_ids=())
  config = SamplingConfig(max_new_tokens=5, temperature=1.0)
  for length in (3, 9, 16):  # one prompt bucket (16)
    sampler.generate([list(range(4, 4 + length))] * 2, config)
  assert sampler.traces == 1
  sampler.generate([[4] * 9] * 2, SamplingConfig(max_new_tokens=11))
  assert sampler.traces == 1  # 5 and 11 new tokens share the 16 bucket
  sampler.generate([[4] * 17] * 2, config)  # next prompt bucket (32)
  assert sampler.traces == 2
  sampler.generate([[4] * 9] * 2, SamplingConfig(max_new_tokens=5,
                                                 greedy=True))
  assert sampler.traces == 3  # another decoding rule


def decode_body(hlo: str, shape: str) -> str:
  """The decode loop's body: the computation that takes and returns a
  state holding `shape`."""
  bodies = [c for c in hlo.split('\n\n')
            if re.match(rf'%\S+ \(.*{re.escape(shape)}.*\) -> \(', c)]
  assert len(bodies) == 1, len(bodies)
  return bodies[0]


@pytest.mark.parametrize('family', ['gemma', 'gemma2'])  # 1 and 2 KV heads
@pytest.mark.parametrize('per_layer', [True, False])
@pytest.mark.parametrize('rows', [3, 1])
def test_the_compiled_loop_copies_no_cache_and_sorts_nothing(
    family, per_layer, rows, tmp_path):
  """Per decode step each layer's keys and values are written in place and
  attended to where they are: no copy of the cache (a scan that returned it
  as outputs copied every layer's cache each step; on CPU a layer's slice
  of the stacked cache was copied out for its attention, 7% of a small
  model's step, and a single KV head's or a single row's buffers read
  through a reshape were copied twice). On CPU each layer has buffers of
  its own (keys transposed); elsewhere (`per_layer` False) the stacked ones. Top-p finds
  its threshold without sorting the vocabulary, and RoPE's angles are
  computed before the loop (XLA computed them inside every rotation, for
  each head: 4%)."""
  hf_models.make(family, str(tmp_path))
  model = checkpoints.load(str(tmp_path))[0]
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ('fsdp', 'tp'))
  sampler = Sampler(model, pad_id=0, eos_ids=(), mesh=mesh,
                    rules=common.sharding())
  assert sampler.split_layers
  sampler.split_layers = per_layer
  config = SamplingConfig(max_new_tokens=16, temperature=1.0, top_p=0.9)
  hlo = sampler.lower(rows, 16, config).compile().as_text()
  cache = Cache.empty(model.cfg, rows, 32)
  name = lambda x: f'f32[{",".join(map(str, x.shape))}]'
  if per_layer:  # the decode step makes its buffers by their writes alone
    split = cache.per_layer()
    keys, values = split.k, split.v
    assert keys[0][0][0].shape[-2:] == (model.cfg.head_dim, 32)  # [.., H, S]
    buffers = [name(x) for x in jax.tree.leaves((keys, values))]
    assert len(buffers) == 2 * model.cfg.num_layers
    for shape in set(buffers):
      made = [line for line in decode_body(hlo, shape).split('\n')
              if re.search(rf'= {re.escape(shape)}{{', line)
              and 'get-tuple-element(' not in line]
      assert len(made) == buffers.count(shape)
      assert all('op_name="jit(_program)/while/body/dynamic_update_slice"'
                 in line for line in made)
  else:
    shape = name(cache.k[0][0])
    loops = hlo[:hlo.index('\nENTRY')]  # every computation but the entry
    assert shape in loops  # the cache is there, by this name
    assert not re.search(rf'= {re.escape(shape)}{{[0-9,]*}} copy\(', loops)
  assert ' sort(' not in hlo
  assert not re.search(r'op_name="[^"]*while/body[^"]*/(sin|cos)"', hlo)
  assert re.search(r'op_name="jit\(_program\)/(sin|cos)"', hlo)


def test_on_cpu_the_prefill_and_decode_loop_slice_no_weights(model):
  """The prefill and the decode loop read each layer's weights sliced once
  per call: XLA:CPU copies a slice of a stacked weight wherever it is read,
  which was a quarter of a small model's decode step (the weights copied
  per step), and the prefill's scan over the layers copied each again (a
  fifth of a one-row call)."""
  sampler = Sampler(model, pad_id=0, eos_ids=())
  config = SamplingConfig(max_new_tokens=16, temperature=1.0)
  scalars = sampler._scalars(config)
  max_new, stops, temperature, top_p, key = scalars
  rows = jnp.zeros((3, 16), jnp.int32)
  state = jax.eval_shape(functools.partial(sampler._prefill, cache_size=32,
                                           generations=1),
                         sampler.params, rows, rows, rows, None, key)
  decode = sampler._decode_chunk.lower(
      sampler.params, state, 16, max_new, stops, temperature, top_p,
      cache_size=32, **sampler._statics(config))
  whole = sampler._generate.lower(
      sampler.params, rows, rows, rows, None, *scalars, cache_size=32,
      generations=1, **sampler._statics(config))
  stacked = model.groups[0][0].mlp.gate.shape  # [repeats, embed, mlp]
  assert stacked[0] > 1
  for program in (decode, whole):
    hlo = program.compile().as_text()
    entry = hlo[hlo.index('\nENTRY'):]
    readers = re.findall(  # the computations that take a stacked weight
        rf'^%(\S+) \(.*f32\[{",".join(map(str, stacked))}\]', hlo, re.M)
    assert readers  # the weight is there, by this name
    assert all(f'calls=%{name}' in entry for name in readers)  # sliced once


def test_weights_too_large_to_copy_are_sliced_per_step(model, monkeypatch):
  """The once-per-call slices hold a second copy of the layers' weights:
  not when that copy would take over an eighth of the host's memory. Both
  ways give the same greedy tokens."""
  layers = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model.groups)))
  memory = collections.namedtuple('Memory', 'total')
  monkeypatch.setattr(psutil, 'virtual_memory', lambda: memory(8 * layers))
  assert Sampler(model, pad_id=0, eos_ids=()).split_layers
  monkeypatch.setattr(psutil, 'virtual_memory',
                      lambda: memory(8 * layers - 8))
  sliced_per_step = Sampler(model, pad_id=0, eos_ids=())
  assert not sliced_per_step.split_layers
  monkeypatch.undo()
  greedy = SamplingConfig(max_new_tokens=10, greedy=True)
  assert np.array_equal(
      sliced_per_step.generate(PROMPTS, greedy).tokens,
      Sampler(model, pad_id=0, eos_ids=()).generate(PROMPTS, greedy).tokens)


def test_generations_share_each_prompts_prefill(model):
  """G generations of each prompt equal the prompt repeated G times (the
  same tokens; log-probabilities to float rounding: XLA's matmul blocking
  follows the row count), from one prefill per prompt (GRPO's groups: G
  times less prefill)."""
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ('fsdp', 'tp'))
  sampler = Sampler(model, pad_id=0, eos_ids=(), mesh=mesh,
                    rules=common.sharding())
  config = SamplingConfig(max_new_tokens=8, temperature=1.0, top_p=0.9,
                          seed=3)
  shared = dataclasses.replace(config, generations=3)
  out = sampler.generate(PROMPTS, shared)
  repeated = sampler.generate([p for p in PROMPTS for _ in range(3)], config)
  for field in ('tokens', 'mask', 'lengths'):
    assert np.array_equal(getattr(out, field), getattr(repeated, field))
  np.testing.assert_allclose(out.logprobs, repeated.logprobs, rtol=1e-6)
  greedy = dataclasses.replace(config, greedy=True)
  assert np.array_equal(
      sampler.generate(PROMPTS, dataclasses.replace(greedy, generations=3)
                       ).tokens,
      sampler.generate([p for p in PROMPTS for _ in range(3)], greedy).tokens)
  assert len(set(map(tuple, np.asarray(out.tokens[:3]).tolist()))) > 1
  hlo = sampler.lower(3, 16, shared).compile().as_text()
  d = model.cfg.embed_dim
  assert f'f32[{3 * 16},{d}]' in hlo  # the prefill: 3 prompts' 16 tokens
  assert f'f32[{9 * 16},{d}]' not in hlo


def test_on_a_tp_mesh_each_row_is_sampled_whole_on_its_devices():
  """With the vocabulary split over tp=4, the decode step gathers each
  row's logits once: the sampling rule's cumulative sum and its 31-bit
  nucleus search then run locally, where on split rows they cost a halo
  exchange (collective-permute) and an all-reduce per bit (6-10x the whole
  generation of a vocab-32k model on CPU)."""
  mesh = Mesh(np.array(jax.devices()[:4]).reshape(1, 4), ('fsdp', 'tp'))
  sharded = checkpoints.init(presets.PRESETS['tiny-gemma'], seed=0,
                             mesh=mesh, rules=common.sharding())  # vocab 128
  sampler = Sampler(sharded, pad_id=0, eos_ids=(), mesh=mesh,
                    rules=common.sharding())
  config = SamplingConfig(max_new_tokens=16, temperature=1.0, top_p=0.9)
  hlo = sampler.lower(4, 16, config).compile().as_text()
  assert not re.search(r' collective-permute(-start)?\(', hlo)
  assert len(re.findall(r' all-reduce(-start)?\(', hlo)) < 31


def test_stops_per_row_and_masks(model):
  sampler = Sampler(model, pad_id=0, eos_ids=())
  free = sampler.generate(PROMPTS, SamplingConfig(max_new_tokens=10,
                                                  greedy=True))
  stop = int(free.tokens[0, 3])  # row 0 reaches it at step <= 3
  out = sampler.generate(PROMPTS, SamplingConfig(
      max_new_tokens=10, greedy=True, stop_ids=(stop,)))
  for row in range(len(PROMPTS)):
    tokens = np.asarray(free.tokens[row]).tolist()
    n = tokens.index(stop) + 1 if stop in tokens else 10
    assert int(out.lengths[row]) == n
    assert np.asarray(out.mask[row]).tolist() == [True] * n + [False] * (
        10 - n)
    assert np.asarray(out.tokens[row, :n]).tolist() == tokens[:n]
    assert (np.asarray(out.tokens[row, n:]) == 0).all()
    assert (np.asarray(out.logprobs[row, n:]) == 0).all()


def test_sampling_statistics_on_fixed_logits():
  # Probabilities in a scrambled vocabulary order: the nucleus and the top k
  # are not a prefix of the vocabulary.
  ranked = np.array([0.30, 0.25, 0.15, 0.12, 0.08, 0.05, 0.03, 0.02])
  order = np.array([3, 0, 6, 1, 7, 2, 5, 4])  # token of the i-th best
  probs = np.zeros(8)
  probs[order] = ranked
  draws = 40_000
  batch = jnp.broadcast_to(jnp.log(jnp.asarray(probs, jnp.float32)),
                           (draws, 8))
  uniform = jax.random.uniform(jax.random.key(0), (draws,))

  def frequencies(**kw):
    tokens, log_kept = rules.sample(batch, uniform, jnp.float32(1.0),
                                    jnp.float32(kw.pop('top_p', 1.0)), **kw)
    return np.bincount(np.asarray(tokens), minlength=8), np.asarray(log_kept)

  for kwargs, best in [
      (dict(top_k=3, use_top_p=False), 3),
      (dict(top_k=0, use_top_p=True, top_p=0.65), 3),  # 0.30+.25+.15
      (dict(top_k=5, use_top_p=True, top_p=0.5), 2),
      (dict(top_k=0, use_top_p=False), 8),
  ]:
    counts, log_kept = frequencies(greedy=False, **kwargs)
    allowed = order[:best]
    assert counts.sum() - counts[allowed].sum() == 0, kwargs
    expected = probs[allowed] / probs[allowed].sum() * counts.sum()
    assert stats.chisquare(counts[allowed], expected).pvalue > 1e-3, kwargs
    # The mass kept, of the full distribution: KL(truncated || full) is
    # -log of it.
    np.testing.assert_allclose(log_kept, np.log(probs[allowed].sum()),
                               rtol=1e-5, atol=1e-6, err_msg=str(kwargs))
  greedy, log_kept = rules.sample(batch[:4], uniform[:4], jnp.float32(1.0),
                                  jnp.float32(1.0), top_k=0, use_top_p=False,
                                  greedy=True)
  assert (np.asarray(greedy) == order[0]).all() and not np.any(log_kept)


def test_nucleus_threshold_is_exact_and_keeps_ties():
  probs = jnp.array([[0.2, 0.4, 0.2, 0.2], [0.1, 0.6, 0.25, 0.05]])
  for top_p, expected in [(0.4, [0.4, 0.6]), (0.5, [0.2, 0.6]),
                          (0.61, [0.2, 0.25]), (0.9, [0.2, 0.1])]:
    got = rules.nucleus_threshold(probs, jnp.float32(top_p))
    np.testing.assert_array_equal(got, np.float32(expected))


def test_seeded_and_deterministic(model):
  sampler = Sampler(model, pad_id=0, eos_ids=())
  config = SamplingConfig(max_new_tokens=8, temperature=1.0, seed=3)
  a = sampler.generate(PROMPTS, config)
  b = sampler.generate(PROMPTS, config)
  c = sampler.generate(PROMPTS, SamplingConfig(max_new_tokens=8, seed=4))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert not np.array_equal(a.tokens, c.tokens)


def test_sharded_on_a_4_device_rollout_mesh_equals_one_device(tmp_path):
  hf_models.make('gemma2', str(tmp_path))
  mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ('fsdp', 'tp'))
  rules_ = common.sharding()
  single = Sampler(checkpoints.load(str(tmp_path))[0], pad_id=0, eos_ids=())
  sharded_model, _ = checkpoints.load(str(tmp_path), mesh=mesh, rules=rules_)
  sharded = Sampler(sharded_model, pad_id=0, eos_ids=(), mesh=mesh,
                    rules=rules_)
  prompts = PROMPTS + [[3, 4, 5, 6]]  # 4 rows: 2 per data shard
  greedy = SamplingConfig(max_new_tokens=10, greedy=True)
  np.testing.assert_array_equal(sharded.generate(prompts, greedy).tokens,
                                single.generate(prompts, greedy).tokens)


def test_update_weights_serves_new_parameters(model, tmp_path):
  hf_models.make('gemma2', str(tmp_path), seed=5)
  other, _ = checkpoints.load(str(tmp_path))
  sampler = Sampler(model, pad_id=0, eos_ids=())
  greedy = SamplingConfig(max_new_tokens=10, greedy=True)
  before = sampler.generate(PROMPTS, greedy).tokens
  sampler.update_weights(nnx.state(other))
  expected = Sampler(other, pad_id=0, eos_ids=()).generate(PROMPTS, greedy)
  np.testing.assert_array_equal(sampler.generate(PROMPTS, greedy).tokens,
                                expected.tokens)
  assert not np.array_equal(before, expected.tokens)
  # A subset (as LoRA adapters would be) updates just those parameters.
  subset = nnx.from_flat_state([(p, v) for p, v in
                                nnx.state(model).flat_state()
                                if p[-1] == 'q'])
  sampler.update_weights(subset)
  assert sampler.generate(PROMPTS, greedy).tokens.shape == (3, 10)


def test_partial_rollouts_take_new_weights_between_chunks(model, tmp_path):
  """Decoding 4 tokens per call equals one loop while the weights stay;
  weights served mid-generation produce the later chunks (as a run on them
  from that point would), and every token records its weights' version."""
  hf_models.make('gemma2', str(tmp_path), seed=5)
  other, _ = checkpoints.load(str(tmp_path))
  greedy = SamplingConfig(max_new_tokens=10, greedy=True)
  whole = Sampler(model, pad_id=0, eos_ids=()).generate(PROMPTS, greedy)
  chunked = Sampler(model, pad_id=0, eos_ids=(), decode_chunk=4)
  out = chunked.generate(PROMPTS, greedy)
  np.testing.assert_array_equal(out.tokens, whole.tokens)
  np.testing.assert_allclose(out.logprobs, whole.logprobs, atol=1e-5)
  assert (out.versions == 0).all()
  # The new weights arrive while the first chunk decodes.
  serving, calls = chunked.serving, []
  def serve():
    calls.append(1)
    if len(calls) == 2:
      chunked.update_weights(nnx.state(other), version=7)
    return serving()
  chunked.serving = serve
  out = chunked.generate(PROMPTS, greedy)
  assert (out.versions[:, :4] == 0).all() and (out.versions[:, 4:] == 7).all()
  np.testing.assert_array_equal(out.tokens[:, :4], whole.tokens[:, :4])
  assert not np.array_equal(out.tokens[:, 4:], whole.tokens[:, 4:])


def test_bad_inputs_are_usage_errors(model):
  sampler = Sampler(model, pad_id=0, eos_ids=(), max_cache=32)
  with pytest.raises(UsageError, match='prompt 1 is empty'):
    sampler.generate([[3], []], SamplingConfig(max_new_tokens=4))
  with pytest.raises(UsageError, match='exceeds the cache of 32'):
    sampler.generate([[3] * 30], SamplingConfig(max_new_tokens=4))
  with pytest.raises(UsageError, match='max_new_tokens=0'):
    SamplingConfig(max_new_tokens=0)
  for top_p in (0.0, 1.5):
    with pytest.raises(UsageError, match='top_p'):
      SamplingConfig(max_new_tokens=1, top_p=top_p)
