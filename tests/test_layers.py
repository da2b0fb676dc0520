"""The package's layers, from the source's imports (every import, those
inside functions too): a module imports only its own layer and those below,
a job no other job (a pipeline reaches its stages through the job
registry, `tunix_pw/jobs/__init__.py`), and no modules import each other
in a circle.

agents/ sits above rl/: an environment scores with rl's verifiers and an
episode becomes rl's groups; rl never reaches into agents.
"""

import ast
import graphlib
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / 'tunix_pw'
# Bottom to top; a module's layer is its first name under tunix_pw.
LAYERS = [
    ('errors', 'workdir', 'console', 'registry', 'checks', 'sandbox'),
    ('runtime',),
    ('models',),
    ('sampling', 'data'),
    ('train', 'estimate'),
    ('rl',),
    ('agents', 'compile_only', 'planner'),
    ('jobs', 'configs'),
    ('main',),
]
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in PACKAGE.rglob('*.py'):
    parts = ('tunix_pw',) + path.relative_to(PACKAGE).with_suffix('').parts
    out['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
  return out


def imports(path: pathlib.Path, known: set[str]) -> set[str]:
  """The package's modules `path` imports (`from a import b` names module
  a.b when there is one, else a)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      found.update(f'{node.module}.{a.name}'
                   if f'{node.module}.{a.name}' in known else node.module
                   for a in node.names)
  return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
  """module -> the modules it imports."""
  found = modules()
  return {name: imports(path, set(found)) - {name}
          for name, path in found.items()}


def edges() -> list[tuple[str, str]]:
  return [(a, b) for a, imported in graph().items() for b in imported]


def level(module: str) -> int:
  parts = module.split('.')
  if len(parts) == 1:  # the package itself
    return 0
  return LEVEL[parts[1]]


def test_every_module_has_a_layer():
  assert not [m for m in graph() if m != 'tunix_pw'
              and m.split('.')[1] not in LEVEL]


def test_no_import_reaches_up():
  assert not [f'{a} -> {b}' for a, b in edges() if level(b) > level(a)]


def test_a_job_imports_no_other_job():
  job = lambda m: m.startswith('tunix_pw.jobs.')
  assert not [f'{a} -> {b}' for a, b in edges() if job(a) and job(b)]


def test_no_modules_import_each_other_in_a_circle():
  graphlib.TopologicalSorter(graph()).prepare()  # CycleError names one

