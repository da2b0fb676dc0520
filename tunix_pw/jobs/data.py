"""Data: prepare a dataset and read one epoch (or some batches) of its SFT
pipeline on every process, reporting examples, tokens, truncations, drops
and skipped lines; optionally the example indices each process read."""

from __future__ import annotations

import json
from typing import Any

from etils import epath

from tunix_pw import console
from tunix_pw import workdir as workdir_lib
from tunix_pw.data import formats, pipeline
from tunix_pw.errors import UsageError
from tunix_pw.models import tokenizers
from tunix_pw.runtime import backend, meshes as meshes_lib
from tunix_pw.runtime.preemption import Preemption


def validate(config: Any) -> None:
  pipeline.check_data_block(config.data)
  if config.split not in ('train', 'test'):
    raise UsageError(f"--config.split={config.split!r} must be 'train' or "
                     "'test'.")
  if config.batch_size < 1:
    raise UsageError(f'--config.batch_size={config.batch_size} must be at '
                     'least 1.')


def run(config: Any, runtime: backend.Runtime, meshes: meshes_lib.RoleMeshes,
        workdir: str, preemption: Preemption) -> None:
  del meshes  # host-side only
  spec = pipeline.DataSpec.from_block(config.data)
  sources, skipped = pipeline.prepare(spec, runtime)
  tokenizer = tokenizers.load(config.tokenizer)
  transform = formats.sft_transform(spec.name, tokenizer,
                                    config.data.max_length,
                                    config.data.overlong, config.data.chat)

  def with_index(example, counters):
    out = transform(example, counters)
    return None if out is None else dict(out, index=example['index'])

  source = sources[config.split]
  reader = pipeline.Pipeline(
      source, with_index, batch_size=config.batch_size, seed=config.seed,
      num_epochs=1, process_index=runtime.process_index,
      process_count=runtime.process_count)
  per_process = len(source) // runtime.process_count
  total = config.max_batches or per_process // reader.local_batch
  indices, tokens = [], 0
  with console.Progress(total, 'data', enabled=runtime.is_coordinator) as bar:
    for _, batch in zip(range(total), reader):
      indices += [int(ex['index']) for ex in batch]
      tokens += sum(len(ex['tokens']) for ex in batch)
      bar.update()
      preemption.check()

  counters = reader.counters
  if config.dump:
    (epath.Path(workdir) /
     workdir_lib.data_report(runtime.process_index)).write_text(
        json.dumps(dict(indices=indices, counters=vars(counters))))
  if runtime.is_coordinator:
    print(f'data: {spec.name}/{config.split}: {len(source)} examples in the '
          f'split; process 0 read {len(indices)} ({tokens} tokens), '
          f'truncated {counters.truncated}, dropped {counters.dropped}; '
          f'skipped bad lines {skipped or 0}')
