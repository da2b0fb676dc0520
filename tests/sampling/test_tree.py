"""Tree rollouts: forks copy their parent's state and KV cache exactly
(greedy forks continue as their parent; sampled forks share its prefix and
their tokens' log-probabilities are the full forward pass's), the branch
rule by hand, and the tokens a tree saves."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.sampling.test_sampler import PROMPTS, model, models  # noqa: F401 (fixtures)
from tunix_pw.errors import UsageError
from tunix_pw.rl import loss
from tunix_pw.sampling import tree
from tunix_pw.sampling.rollout import Completions, SamplingConfig
from tunix_pw.sampling.sampler import Sampler


def sampler_for(model, per_layer):  # pylint: disable=redefined-outer-name
  sampler = Sampler(model, pad_id=0, eos_ids=())
  sampler.split_layers = per_layer  # per-layer buffers, or stacked ones
  return sampler


@pytest.mark.parametrize('per_layer', [True, False])
def test_greedy_forks_continue_exactly_as_their_parent(model, per_layer):  # pylint: disable=redefined-outer-name
  """One chain per prompt forks once at each branch point (tokens 4, 8,
  12): every row is then the prompt's greedy completion, and the tree
  decoded 16 + 12 + 8 + 4 tokens per prompt where 4 chains take 64."""
  sampler = sampler_for(model, per_layer)
  greedy = SamplingConfig(max_new_tokens=16, greedy=True)
  out = sampler.generate_tree(PROMPTS, SamplingConfig(
      max_new_tokens=16, greedy=True, generations=4),
                              tree.TreeShape(chains=1, segment=4, branches=1,
                                             forks=1))
  chains = np.asarray(sampler.generate(PROMPTS, greedy).tokens)
  np.testing.assert_array_equal(np.asarray(out.completions.tokens),
                                np.repeat(chains, 4, axis=0))
  assert out.born.tolist() == [0, 4, 8, 12] * 3
  assert all(out.parent[p * 4] == -1 for p in range(3))
  assert out.decoded() == 3 * (16 + 12 + 8 + 4)


@pytest.mark.parametrize('per_layer', [True, False])
def test_sampled_forks_share_the_prefix_and_sample_the_policy(
    model, per_layer):  # pylint: disable=redefined-outer-name
  """Two chains per prompt; at tokens 4 and 8 the more surprising one
  forks twice. A fork's tokens before it was born are its parent's; after,
  its own (some differ), and each recorded log-probability is the
  trainer's of the whole sequence (1e-5): the copied cache is the
  parent's, at the right positions."""
  sampler = sampler_for(model, per_layer)
  out = sampler.generate_tree(PROMPTS[:2], SamplingConfig(
      max_new_tokens=12, temperature=1.0, seed=5, generations=6),
                              tree.TreeShape(chains=2, segment=4, branches=1,
                                             forks=2))
  tokens = np.asarray(out.completions.tokens)
  logprobs = np.asarray(out.completions.logprobs)
  assert out.active.all() and out.born.tolist() == [0, 0, 4, 4, 8, 8] * 2
  differ = 0
  for row in np.flatnonzero(out.parent >= 0):
    start, parent = out.born[row], out.parent[row]
    np.testing.assert_array_equal(tokens[row, :start], tokens[parent, :start])
    np.testing.assert_array_equal(logprobs[row, :start],
                                  logprobs[parent, :start])
    differ += not np.array_equal(tokens[row, start:], tokens[parent, start:])
  assert differ >= 4
  for row in range(len(tokens)):
    prompt = PROMPTS[row // 6]
    sequence = jnp.asarray([prompt + tokens[row].tolist()])
    trainer = loss.token_logps(model, sequence,
                               jnp.arange(sequence.shape[1])[None],
                               jnp.ones_like(sequence))[0]
    np.testing.assert_allclose(logprobs[row],
                               np.asarray(trainer[0, len(prompt) - 1:]),
                               atol=1e-5)
  assert out.decoded() == 2 * (2 * 12 + 2 * 8 + 2 * 4)


def test_the_most_surprising_live_chains_fork_into_free_slots():
  shape = tree.TreeShape(chains=2, segment=4, branches=1, forks=2)
  active = np.array([1, 1, 0, 0, 1, 1, 1, 0], bool)  # 2 prompts x 4 slots
  done = np.array([0, 0, 0, 0, 1, 0, 0, 0], bool)
  uncertainty = np.array([0.5, 0.9, 0, 0, 3.0, 0.1, 0.2, 0])
  # Prompt 0: row 1 (0.9) takes both free slots; prompt 1: row 4 is done,
  # row 6 (0.2) beats row 5 and takes the one free slot.
  assert tree.branch(shape, 4, active, done, uncertainty).tolist() == [
      0, 1, 1, 1, 4, 5, 6, 6]
  logprobs = np.array([[-1.0, -3.0, -5.0, 0.0], [-2.0, 0.0, 0.0, 0.0]])
  np.testing.assert_allclose(tree.surprisal(logprobs, np.array([3, 1]), 0, 4),
                             [3.0, 2.0])
  assert tree.roots(2, 3, 1).tolist() == [1, 0, 0, 1, 0, 0]


@pytest.mark.parametrize('shape, says', [
    (tree.TreeShape(0, 4, 1, 1), 'chains=0 must be from 1 to the 4'),
    (tree.TreeShape(5, 4, 1, 1), 'chains=5 must be from 1 to the 4'),
    (tree.TreeShape(1, 0, 1, 1), 'segment=0 must be at least 1'),
    (tree.TreeShape(1, 4, 1, 0), 'forks=0 must be at least 1')])
def test_bad_tree_shapes_are_usage_errors(shape, says):
  with pytest.raises(UsageError, match=says):
    shape.check(4)


def hand_tree():
  """Prompt of 4 slots, segments of 2 tokens: chains 0 and 2 from the
  prompt, 1 forked from 0 and 3 from 2 at token 2; row 3 ends after 3
  tokens."""
  lengths = np.array([4, 4, 4, 3])
  zeros = np.zeros((4, 4))
  return tree.Tree(Completions(zeros.astype(np.int32), zeros,
                               np.arange(4)[None] < lengths[:, None], lengths),
                   parent=np.array([-1, 0, -1, 2]), born=np.array([0, 2, 0, 2]),
                   active=np.ones(4, bool))


def test_tree_advantages_by_hand():
  """Rewards 1, 0, 1, 1 (root value 0.75). Row 0's first segment is shared
  with row 1 (V 0.5 over 2 leaves): global -0.25 + local -0.25, over
  sqrt(2); its second is its own (V 1, parent 0.5): 0.25 + 0.5. Row 1's
  own: -0.75 - 0.5. Rows 2 and 3 share V 1: 0.5 / sqrt(2); then 0.25 + 0
  each; row 3's fourth token does not exist."""
  got = tree.advantages(hand_tree(), np.array([1.0, 0.0, 1.0, 1.0]), 4, 2)
  s = 1 / np.sqrt(2)
  np.testing.assert_allclose(got, [[-0.5 * s, -0.5 * s, 0.75, 0.75],
                                   [-0.5 * s, -0.5 * s, -1.25, -1.25],
                                   [0.5 * s, 0.5 * s, 0.25, 0.25],
                                   [0.5 * s, 0.5 * s, 0.25, 0.0]], rtol=1e-6)
  only_global = tree.advantages(hand_tree(), np.array([1.0, 0.0, 1.0, 1.0]),
                                4, 2, local=0.0, by_leaves=False)
  np.testing.assert_allclose(only_global[1], [-0.25, -0.25, -0.75, -0.75])
  assert not tree.advantages(hand_tree(), np.ones(4), 4, 2).any()


def test_the_decode_batch_holds_the_used_rows_only():
  """Per prompt its used rows, padded to a power of two (at least 2)."""
  active = np.array([1, 0, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0], bool)  # 2 x 6
  assert tree.layout(active, 6).tolist() == [0, 2, -1, -1, 6, 7, 8, -1]
  assert tree.layout(tree.roots(3, 4, 1), 4).tolist() == [0, -1, 4, -1,
                                                          8, -1]
