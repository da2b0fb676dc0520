"""The one exception type that maps to exit code 2."""


class UsageError(Exception):
  """Bad config, usage or input.

  The message is one sentence naming the field (or file) and the fix; `main`
  prints it without a traceback and exits with code 2.
  """


# What static checks look at. The XPK launcher turns CHECK_FILES off: the
# checkpoints and data a config names live in the cluster's images and
# mounts. Compile-only checks turn both off: they compile from shapes, so a
# config needs no dataset at all.
CHECK_FILES = True
CHECK_DATA = True
