"""The exception types `main` prints as one sentence (bad input: exit
code 2; failed infrastructure: exit code 1), and how a full disk is
recognised (exit code 1)."""

import errno
import os


class UsageError(Exception):
  """Bad config, usage or input.

  The message is one sentence naming the field (or file) and the fix; `main`
  prints it without a traceback and exits with code 2.
  """


class InfrastructureError(Exception):
  """The machinery under the job failed (not the config, not the model):
  e.g. too many code sandboxes could not start in a step. `main` prints
  the one-sentence message without a traceback and exits with code 1."""


OUT_OF_SPACE = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


def disk_full(error: BaseException) -> str:
  """The first line of the out-of-space error in `error`'s chain ('' when
  it holds none). Orbax's writes fail as tensorstore's ValueError, whose
  text carries the OS error."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    text = str(error)
    if (isinstance(error, OSError) and error.errno in (
        errno.ENOSPC, errno.EDQUOT)) or any(
            words in text for words in OUT_OF_SPACE):
      return text.splitlines()[0] if text else type(error).__name__
    error = error.__cause__ or error.__context__
  return ''

