"""Rollout groups -> training arrays: a tree rollout's per-token
advantages sit where the trainer's log-probabilities of those tokens do."""

import numpy as np

from tunix_pw.rl import batch, functions


def test_token_advantages_are_laid_out_like_the_log_probabilities():
  group = batch.Group(
      prompt=[5, 6, 7], answer='', completions=[[8, 9], [10]],
      truncated=[False, False], rewards=np.array([1.0, 0.0]), per_reward={},
      logprobs=[[-0.1, -0.2], [-0.3]],
      token_advantages=[[0.5, 0.25], [-1.0]])
  arrays = batch.to_arrays([group], [1.0], 6, 0,
                           functions.group_advantage('grpo'))
  # Token t is predicted at t - 1: the completion's first at index 2.
  np.testing.assert_array_equal(arrays['advantages'],
                                [[0, 0, 0.5, 0.25, 0], [0, 0, -1.0, 0, 0]])
  np.testing.assert_array_equal(
      batch.rollout_logps([group], 6) != 0, arrays['advantages'] != 0)
  group.token_advantages = None  # the group advantage of the rewards
  assert batch.to_arrays([group], [1.0], 6, 0, functions.group_advantage(
      'grpo'))['advantages'].shape == (2,)
