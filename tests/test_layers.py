"""The package's layers: arrows only downward, no import cycle, the engine importable alone.

core < models / objectives / datasets / toolbox < algorithms < evaluation < experiment < main (the
top-level ``fedtree/__init__.py`` re-exports lazily and sits outside the order).
"""

import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "fedtree")

LAYERS = {
  "core": 0, "models": 1, "objectives": 1, "datasets": 1, "toolbox": 1, "population": 1, "algorithms": 2,
  "evaluation": 3, "experiment": 4, "main": 5, "convert": 5,
}
"""(``toolbox``: the capabilities' in-jit halves and the accountant, beside the engine, issue 35.)"""


def _module_name(path: str) -> str:
  rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
  return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _modules() -> dict[str, str]:
  out = {}
  for dirpath, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith(".py"):
        path = os.path.join(dirpath, f)
        out[_module_name(path)] = path
  return out


def _resolve(name: str, modules: dict[str, str]) -> str | None:
  """The longest module of the package that ``name`` (a dotted import) refers to."""
  while name:
    if name in modules:
      return name
    name = name.rpartition(".")[0]
  return None


def _imports(path: str, module: str, modules: dict[str, str]) -> set[str]:
  """Every package module ``path`` imports, at any depth of the file (function-level too)."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  is_package = path.endswith("__init__.py")
  out = set()
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = module.split(".")
        parts = parts if is_package else parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
      names = [base] + [f"{base}.{a.name}" for a in node.names]
    for n in names:
      target = _resolve(n, modules)
      # a module's own ancestor packages are initialized before it: not an edge
      if target is not None and target != "fedtree" and not (module + ".").startswith(target + "."):
        out.add(target)
  return out


# Import edges tolerated for now (none: B-HFL's pipeline, which called the runner, became an
# algorithm with a report hook).
KNOWN_EDGES: set[tuple[str, str]] = set()


def _graph(known=KNOWN_EDGES) -> dict[str, set[str]]:
  modules = _modules()
  graph = {m: _imports(p, m, modules) for m, p in modules.items()}
  return {m: {t for t in ts if (m, t) not in known} for m, ts in graph.items()}


def _layer(module: str) -> int | None:
  parts = module.split(".")
  return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_no_import_from_a_higher_layer():
  bad = []
  for module, targets in _graph().items():
    lo = _layer(module)
    for t in targets:
      hi = _layer(t)
      if lo is not None and hi is not None and hi > lo:
        bad.append(f"{module} -> {t}")
  assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Every back edge of a depth-first walk, as the cycle it closes."""
  state: dict[str, int] = {}
  stack: list[str] = []
  cycles = []

  def visit(m):
    state[m] = 1
    stack.append(m)
    for t in sorted(graph.get(m, ())):
      if state.get(t) == 1:
        cycles.append(stack[stack.index(t):] + [t])
      elif t not in state:
        visit(t)
    stack.pop()
    state[m] = 2

  for m in sorted(graph):
    if m not in state:
      visit(m)
  return cycles


def test_no_import_cycle():
  cycles = _cycles(_graph())
  assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_can_fail():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
  assert _cycles({"a": {"b"}, "b": set()}) == []
  assert _cycles(_graph()) == []


def test_the_scan_sees_function_level_and_relative_imports(tmp_path):
  """The checker itself can fail: a function-level import is an edge."""
  src = "def f():\n  from fedtree.experiment import runner\n  return runner\n"
  path = tmp_path / "x.py"
  path.write_text(src)
  modules = _modules()
  assert "fedtree.experiment.runner" in _imports(str(path), "fedtree.core.x", modules)


def test_core_algorithm_imports_no_algorithm():
  code = (
    "import sys, fedtree.core.algorithm\n"
    "bad = sorted(m for m in sys.modules if m.startswith(('fedtree.algorithms', 'fedtree.experiment',"
    " 'fedtree.objectives', 'fedtree.evaluation')))\n"
    "print(bad)\n"
    "assert not bad, bad\n"
  )
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
  assert out.returncode == 0, out.stdout + out.stderr


FAMILIES = ("optimization", "personalized", "partial", "clustering", "hierarchical", "asynchronous",
            "heterogeneous")
"""The algorithms wing's family folders; ``host`` is below them all (every family may import it)."""


def _family(module: str) -> str | None:
  parts = module.split(".")
  return parts[2] if len(parts) > 2 and parts[1] == "algorithms" else None


def cross_family_imports(graph: dict[str, set[str]]) -> list[str]:
  """Every import from one family folder into another (``host`` and the package root excepted)."""
  bad = []
  for module, targets in graph.items():
    mine = _family(module)
    if mine not in FAMILIES:
      continue
    bad += [f"{module} -> {t}" for t in targets if _family(t) in FAMILIES and _family(t) != mine]
  return sorted(bad)


def test_no_import_between_algorithm_families():
  bad = cross_family_imports(_graph())
  assert not bad, "imports between family folders:\n" + "\n".join(bad)


def test_the_family_check_can_fail():
  graph = {"fedtree.algorithms.partial.fedbn": {"fedtree.algorithms.host.hierfavg",
                                                "fedtree.algorithms.optimization.fedprox"}}
  assert cross_family_imports(graph) == [
    "fedtree.algorithms.partial.fedbn -> fedtree.algorithms.optimization.fedprox"]


def test_the_algorithms_top_level_is_the_host_and_the_families():
  entries = sorted(e for e in os.listdir(os.path.join(PACKAGE, "algorithms")) if e != "__pycache__")
  assert entries == sorted(("__init__.py", "host") + FAMILIES), entries
