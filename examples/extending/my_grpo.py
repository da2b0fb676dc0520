"""GRPO's runlocal config with my_extensions.py's advantage and reward.

  PYTHONPATH=examples/extending python -m tunix_pw.main \
      --config=examples/extending/my_grpo.py --workdir=/tmp/median
"""

import my_extensions  # noqa: F401  (registers its advantage and reward)

from tunix_pw.configs import grpo


def get_config(arg: str | None = None):
  config = grpo.get_config(arg or 'runlocal')
  config.rl.advantage = 'median_baseline'
  config.rl.rewards = 'exact_answer:1.0,short_answer:0.1'
  return config
