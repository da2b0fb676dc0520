"""DPO's runlocal config with the hinge loss of my_extensions.py.

  PYTHONPATH=examples/extending python -m tunix_pw.main \
      --config=examples/extending/my_dpo.py --workdir=/tmp/hinge
"""

import my_extensions  # noqa: F401  (registers 'hinge')

from tunix_pw.configs import dpo


def get_config(arg: str | None = None):
  config = dpo.get_config(arg)
  config.dpo.algorithm = 'hinge'
  return config
