"""Generate: try a checkpoint (before or after training) on some prompts.

  python -m tunix_pw.main --config=tunix_pw/configs/generate.py:gemma2-2b \
      --config.model.checkpoint=/ckpt/gemma-2-2b-it \
      --config.prompt="Why is the sky blue?" --config.chat=True \
      --workdir=/tmp/generate
  python -m tunix_pw.main --config=tunix_pw/configs/generate.py:runlocal \
      --config.prompts_file=prompts.jsonl --config.output_jsonl=out.jsonl \
      --workdir=/tmp/generate

arg: a model preset name, or 'runlocal' (tiny model, character tokenizer).
"""

import ml_collections

from tunix_pw.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  preset = 'tiny-gemma2' if arg in (None, '', 'runlocal') else arg
  c = ml_collections.ConfigDict()
  c.job = 'generate'
  c.seed = 0
  c.model = common.model(preset)
  c.prompt = ''  # one prompt; or:
  c.prompts_file = ''  # one prompt per line, or JSONL {"prompt"|"messages"}
  c.chat = False  # wrap prompts in the tokenizer's chat template
  c.batch_size = 8  # prompts per generate call
  c.sampling = ml_collections.ConfigDict(dict(
      max_new_tokens=64, temperature=0.0, top_k=0, top_p=1.0, seed=0,
      max_cache=0))  # max_cache 0: the model's max positions
  c.output_jsonl = ''  # tokens and logprobs per prompt
  c.images = common.images()
  c.runtime = common.runtime(host_device_count=8 if arg == 'runlocal' else 0)
  c.meshes = common.meshes('collocated', rollout=('fsdp=1,tp=-1', 'all'))
  c.sharding = common.sharding()
  return c
