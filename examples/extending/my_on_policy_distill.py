"""On-policy distillation (GRPO's runlocal,distill config) with
my_extensions.py's token advantage.

  PYTHONPATH=examples/extending python -m tunix_pw.main \
      --config=examples/extending/my_on_policy_distill.py \
      --workdir=/tmp/favoured
"""

import my_extensions  # noqa: F401  (registers its token advantage)

from tunix_pw.configs import grpo


def get_config(arg: str | None = None):
  config = grpo.get_config(arg or 'runlocal,distill')
  config.rl.advantage = 'teacher_favoured'
  return config
