"""The step's phases: update metrics over every mini-batch, and the
rollout correction's weights and shares."""

import ml_collections
import numpy as np
import pytest

from tunix_pw.rl import batch, phases


def test_update_metrics_are_the_weighted_mean_of_every_mini_batch():
  """Two mini-batch updates with different clip fractions: the step reports
  their mean weighted by the tokens each averaged over, not the last."""
  first = dict(loss=1.0, clip_fraction=0.5, kl=0.1, weight=30.0,
               grad_norm=2.0, learning_rate=1e-3, skipped=0.0,
               nonfinite_streak=0.0)
  second = dict(loss=3.0, clip_fraction=0.1, kl=0.3, weight=10.0,
                grad_norm=4.0, learning_rate=2e-3, skipped=1.0,
                nonfinite_streak=1.0)
  got = phases.combine([first, second])
  assert got['clip_fraction'] == pytest.approx((0.5 * 30 + 0.1 * 10) / 40)
  assert got['loss'] == pytest.approx((1 * 30 + 3 * 10) / 40)
  assert got['kl'] == pytest.approx((0.1 * 30 + 0.3 * 10) / 40)
  assert got['weight'] == 40 and got['skipped'] == 1
  assert got['grad_norm'] == 3.0
  assert got['learning_rate'] == 2e-3 and got['nonfinite_streak'] == 1


@pytest.mark.parametrize('tis, mis, level, key, share', [
    (1.6, 0.0, 'token', 'tis_clipped', 3 / 5),  # 2, 0.5 and 3
    (0.0, 1.6, 'token', 'mis_masked', 3 / 5),
    (0.0, 1.6, '', 'mis_masked', 3 / 5),  # sequence: row 0's 3 tokens
    (0.0, 1.6, 'geometric', 'mis_masked', 0.0),  # 1.44 and 1.10: kept
    (0.0, 1.1, 'geometric', 'mis_masked', 3 / 5),  # row 0's 1.44: masked
])
def test_rollout_correction_reports_the_share_clipped_or_masked(
    tis, mis, level, key, share):
  # Token ratios 2, 0.5, 3 and 1.5, 0.8, as in test_functions.py.
  trainer = np.log([[0.5, 0.2, 0.9, 0.3], [0.3, 0.4, 0.5, 0.5]])
  rollout = [np.log([0.25, 0.4, 0.3]).tolist(), np.log([0.2, 0.5]).tolist()]
  groups = [batch.Group([7], '', [[1, 2, 3], [4, 5]], [False, False],
                        np.zeros(2), {}, rollout)]
  arrays = dict(loss_mask=np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]),
                weights=np.ones(2, np.float32))
  rl = ml_collections.ConfigDict(dict(
      tis_cap=tis, mis_threshold=mis, mismatch_metrics=True,
      is_level=level, is_low=0.7))
  result = phases.Rollout(groups, [1.0], {})
  extra, values = phases.rollout_correction(result, arrays, trainer, rl)
  assert values[key] == pytest.approx(share)
  assert extra['is_weights'].shape == (2, 4)
