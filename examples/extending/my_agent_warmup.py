"""The agentic demo's SFT warm-up (tunix_pw/configs/agentic.py) on
my_extensions.py's environment and tool: each training sequence is a
demonstration episode in which `add` really runs.

  PYTHONPATH=examples/extending python -m tunix_pw.main \
      --config=examples/extending/my_agent_warmup.py --workdir=/tmp/adder
"""

import my_extensions  # noqa: F401  (registers its environment and tool)

from tunix_pw.configs import agentic


def get_config(arg: str | None = None):
  warmup = agentic.get_config(arg or 'runlocal').sft  # the pipeline's stage
  warmup.agent.update(env='adder', tools='add')
  return warmup
