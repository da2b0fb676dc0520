"""Runs `tunix_pw.main` inside the calling benchmark's process (so that
presets it registers count) and returns the metrics the job logged."""

import runpy
import sys

from tunix_pw.train import metrics


def run_main(args: list[str], metrics_dir: str) -> list[dict[str, float]]:
  sys.argv = ['main', *args]
  try:
    runpy.run_module('tunix_pw.main', run_name='__main__')
  except SystemExit as e:
    if e.code:
      raise
  return metrics.read(metrics_dir)
