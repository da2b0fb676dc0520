"""The fault campaign's fast subset (`benchmarks/faults.py` runs it whole,
README "Faults"): one trial of each kind, through main in fresh processes,
checked on disk."""

import shutil
import subprocess

import pytest

from benchmarks import faults


@pytest.fixture(scope='module')
def campaign(tmp_path_factory):
  return faults.Campaign(str(tmp_path_factory.mktemp('faults')))


def ok(row: dict) -> dict:
  assert row['outcome'] == 'ok', row
  return row


def test_sigkill_mid_checkpoint_write_resumes_bit_identical(campaign):
  row = ok(campaign.kill('sft', save=2, delay_s=0.0, share=0.0))
  assert row['left_a_partial_write'], row  # the kill hit the write
  assert row['complete_before'] == [5], row


def test_sigterm_in_the_update_phase_exits_42_and_resumes(campaign):
  row = ok(campaign.term('grpo', 'update', 3))
  assert row['exit_s'] < faults.GRACE_S


@pytest.mark.skipif(
    not shutil.which('unshare') or subprocess.run(
        ['unshare', '-m', 'true'], capture_output=True).returncode,
    reason='a private mount namespace needs root (unshare -m)')
def test_a_full_disk_at_a_checkpoint_keeps_the_last_and_resumes(campaign):
  row = ok(campaign.disk('sft', 2))
  assert 'No space left on device, writing checkpoint step 10' in (
      row['error'][0]), row
  assert 'newest complete checkpoint there is step 5' in row['error'][0]
  assert row['complete_before'] == [5], row


def test_a_frozen_peer_during_a_save_ends_the_launcher(campaign):
  row = ok(campaign.peer('sft', 'save', 'SIGSTOP', 2))
  assert row['exit'] not in (0, 42) and row['exit_s'] < faults.PEER_LIMIT_S
