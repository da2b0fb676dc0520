"""The one exception type that maps to exit code 2."""


class UsageError(Exception):
  """Bad config, usage or input.

  The message is one sentence naming the field (or file) and the fix; `main`
  prints it without a traceback and exits with code 2.
  """
