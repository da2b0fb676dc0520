"""Strategies are asked, never told apart by name: outside the module that
registers them, no source compares a value with a registered strategy's
name (a job reads what the registered object says it needs)."""

import ast
import pathlib

import pytest

import tunix_pw
from tunix_pw import jobs, registry  # noqa: F401 (registers the jobs)
from tunix_pw.rl import functions
from tunix_pw.train import distill_strategies, preference

PACKAGE = pathlib.Path(tunix_pw.__file__).parent
HOMES = {'advantage': pathlib.Path(functions.__file__),
         'preference_loss': pathlib.Path(preference.__file__),
         'distill_strategy': pathlib.Path(distill_strategies.__file__)}


def compared(path: pathlib.Path, names: set[str]) -> list[str]:
  """`path:line name` for each comparison that names one of `names`."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Compare):
      found += [f'{path.relative_to(PACKAGE)}:{node.lineno} {c.value}'
                for operand in (node.left, *node.comparators)
                for c in ast.walk(operand)
                if isinstance(c, ast.Constant) and c.value in names]
  return found


@pytest.mark.parametrize('kind', sorted(HOMES))
def test_no_strategy_name_is_compared_outside_its_registration(kind):
  # 'grpo' names a job too, which the pipeline's stages compare.
  names = set(registry.names(kind)) - set(registry.names('job'))
  assert len(names) > 1
  found = [hit for path in sorted(PACKAGE.rglob('*.py'))
           if path != HOMES[kind] for hit in compared(path, names)]
  assert not found, found
