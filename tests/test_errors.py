"""How a full disk is recognised in an exception's chain, whatever wraps
it (Orbax's writes fail as tensorstore's ValueError with the OS text)."""

import errno
import os

from tunix_pw import errors


def test_a_full_disk_is_found_in_the_chain():
  try:
    try:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), '/ckpt/7')
    except OSError as e:
      raise RuntimeError('the checkpoint write failed') from e
  except RuntimeError as wrapped:
    assert errors.disk_full(wrapped).startswith('[Errno 28]')
  text = ValueError(f'tensorstore: {os.strerror(errno.EDQUOT)} at /ckpt')
  assert errors.disk_full(text) == str(text)
  assert errors.disk_full(ValueError('a bad shape')) == ''
