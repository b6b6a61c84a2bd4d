"""The measured figures in a config's docstring, from the command that prints them.

  python -m benchmarks.config_figures --config=configs/fedkws.py           # check
  python -m benchmarks.config_figures --config=configs/fedkws.py --write   # rewrite the table
  python -m benchmarks.config_figures --config=configs/privacy.py:tree     # a variant's table
  python -m benchmarks.config_figures --all                                # every config that states figures
  python -m benchmarks.config_figures --all --quick                        # those of a minute or less

A config file that states figures declares them in a module-level ``FIGURES``: a tuple of
columns ``(header, key, scale, decimals, tolerance)``, where ``key`` is a field of a model's
summary (``summary.json``: ``"accuracy"``, ``"perplexity"``, ``"costs.epochs"`` for a nested
one, ``"group_perplexity.0"`` for an entry of a list) or a function ``(models, model) -> float``
of the run's ``{model: summary}`` (a figure derived from several models, e.g. the number of groups
where a model is best; NaN: no value for that model). The figures are a table in the docstring,
with a row per ``(run, model)`` that the config's final table prints (models that never trained
left out), the values scaled (``100``: percent) and rounded to ``decimals``; the table is the
first indented paragraph after the line that names this command.

The command runs the config as ``python -m fedtree.main`` does (same seed, same data, in a
temporary workdir), builds the table and compares it with the docstring's: a figure that moved
by more than its column's ``tolerance`` (in the printed unit), a row that is missing or extra,
is reported and the exit status is 1. ``--write`` puts the new table into the config file
instead. ``tests/test_config_figures.py`` (slow) runs the check for every config with
``FIGURES``. A variant (``--config=configs/<name>.py:<variant>``, ``get_config(variant)``) has its
own table: the first indented paragraph after the line naming this command with that variant.

A config whose runs are sweeps over seeds (:mod:`fedtree.experiment.sweep`) states the figures of
each model of each run's setting as their means over the seeds (a key's value is the mean of
``<model>/<key>``, or of the run's own ``<key>``, e.g. ``uplink_MB``); with ``FIGURES_TABLE = "runs"``
(configs/baselines.py, whose ``config.sweep.columns`` name the metrics) it states instead the table
the command prints last, a row per run, ``mean ± std`` over seeds in every cell
(:func:`fedtree.experiment.sweep.format_runs_table`); its ``FIGURES`` keys are those columns' metrics
(``"global/accuracy"``) and each column's ``tolerance`` bounds the change of both the mean and the
std; the seeds that reached a target, where the table names them, must not change. With
``FIGURES_TABLE = "swept"`` (configs/personalized.py) it states the table of every run's models the
command prints last without ``sweep.columns`` (:func:`fedtree.experiment.sweep.runs_table`), its
``FIGURES`` the tolerances of that table's four figure columns (:data:`SWEPT_MODELS`). With
``FIGURES_TABLE = "best"`` (configs/tuning.py) it states each run's best setting, that setting's
mean of the study's metric and the client updates the study took (:func:`best_table`; ``FIGURES``:
those two columns). A config whose
plain run states no figures (it needs data this machine lacks, or runs too long) sets
``PLAIN_FIGURES = False`` and names the variants that do in ``FIGURE_VARIANTS``; a variant whose
table is of another kind than the plain run's has its own in ``VARIANT_FIGURES``
(``{variant: (kind, figures)}``: configs/personalized.py's quick variant is not swept).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

COMMAND = "benchmarks.config_figures"


class Column(NamedTuple):
  header: str
  key: str | Callable[[Mapping[str, Any], str], float]
  scale: float = 1.0
  decimals: int = 4
  tolerance: float = 0.0


def split_variant(path: str) -> tuple[str, str | None]:
  """``("configs/<name>.py", variant)`` of ``configs/<name>.py[:variant]``."""
  file, sep, variant = path.rpartition(":")
  if sep and file.endswith(".py") and variant:
    return file, variant
  return path, None


def load_module(path: str):
  """The config file ``path`` (``configs/<name>.py``, a ``:variant`` ignored) as a module."""
  path = split_variant(path)[0]
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f"_config_figures_{name}", path)
  if spec is None or spec.loader is None:
    raise ValueError(f"--config={path!r} is not a Python file")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


TABLES = ("models", "runs", "swept", "best")


def table_of(module, variant: str | None = None) -> str:
  """The kind of figures table a config (or its ``variant``) states: ``FIGURES_TABLE`` (:data:`TABLES`,
  default ``"models"``), or the variant's own in ``VARIANT_FIGURES``."""
  kind = getattr(module, "VARIANT_FIGURES", {}).get(variant, (getattr(module, "FIGURES_TABLE", "models"),))[0]
  if kind not in TABLES:
    raise ValueError(f"{module.__file__}: FIGURES_TABLE={kind!r}; choose one of {TABLES}")
  return kind


def columns_of(module, variant: str | None = None) -> list[Column]:
  """A config's ``FIGURES`` as columns, or its ``variant``'s where ``VARIANT_FIGURES`` gives that
  variant a table of another kind, ``{variant: (kind, figures)}``."""
  own = getattr(module, "VARIANT_FIGURES", {}).get(variant)
  figures = own[1] if own is not None else getattr(module, "FIGURES", None)
  if not figures:
    raise ValueError(f"{module.__file__} declares no FIGURES: it states no figures to check")
  return [Column(*c) for c in figures]


def _value(models: Mapping[str, Any], model: str, key) -> float:
  if callable(key):
    return float(key(models, model))
  v: Any = models[model]
  for part in key.split("."):   # a field of a mapping, or an index of a list ("group_perplexity.0")
    if isinstance(v, Mapping) and part in v:
      v = v[part]
    elif not isinstance(v, Mapping | str) and hasattr(v, "__len__") and part.isdigit() and int(part) < len(v):
      v = v[int(part)]
    else:
      return math.nan
  return math.nan if v is None else float(v)


def seed_means(results: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
  """Swept results as ``{run: {model: {metric: mean over seeds}}}``: a run per setting (``run`` for
  the default one, ``run[setting]`` for another), a model per ``<model>/`` prefix of the setting's
  metrics, the run's own metrics (``uplink_MB``) in every model's; ``<metric>@std`` is the metric's
  standard deviation over the seeds."""
  out: dict[str, dict[str, dict[str, float]]] = {}
  for label, entry in results.items():
    for row in entry.get("sweep", {}).get("settings", []):
      run = label if row["name"] == "default" else f"{label}[{row['name'].replace(' ', '')}]"
      values = {**row["mean"], **{f"{k}@std": v for k, v in row.get("std", {}).items()}}
      shared = {k: v for k, v in values.items() if "/" not in k}
      models: dict[str, dict[str, float]] = {}
      for key, value in values.items():
        if "/" in key:
          model, metric = key.split("/", 1)
          models.setdefault(model, dict(shared))[metric] = value
      out[run] = dict(sorted(models.items()))
  return out


def measure(results: Mapping[str, Mapping[str, Any]], columns: Sequence[Column]
            ) -> dict[tuple[str, str], list[float]]:
  """``{(run, model): [value per column]}`` (scaled, rounded as printed) of a run's results
  (:func:`fedtree.experiment.runner.train_and_evaluate`'s return; swept runs: the means over their
  seeds, :func:`seed_means`); models that never trained (``"trained": false``, left out of the final
  table too) are left out."""
  if is_sweep(results):
    results = seed_means(results)
  out = {}
  for run, models in results.items():
    for model, summary in models.items():
      if summary.get("trained") is False:
        continue
      values = []
      for c in columns:
        v = _value(models, model, c.key) * c.scale
        values.append(round(v, c.decimals) if math.isfinite(v) else math.nan)
      out[(run, model)] = values
  return out


def format_table(rows: Mapping[tuple[str, str], Sequence[float]], columns: Sequence[Column]) -> str:
  """The docstring table: two-space indented, aligned columns, ``-`` for a missing value."""
  lines = [["run", "model"] + [c.header for c in columns]]
  for (run, model), values in rows.items():
    lines.append([run, model] + ["-" if not math.isfinite(v) else f"{v:.{c.decimals}f}"
                                 for v, c in zip(values, columns, strict=True)])
  widths = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
  return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                   for r in lines)


def parse_table(text: str, columns: Sequence[Column]) -> dict[tuple[str, str], list[float]]:
  """The rows of a table written by :func:`format_table` (a header line, then ``run model
  value...`` lines)."""
  lines = [line.split() for line in text.strip("\n").split("\n") if line.strip()]
  rows = {}
  for parts in lines[1:]:
    if len(parts) != 2 + len(columns):
      raise ValueError(f"a figures row has {len(parts)} fields, expected {2 + len(columns)}: {parts}")
    rows[(parts[0], parts[1])] = [math.nan if p == "-" else float(p) for p in parts[2:]]
  return rows


def find_table(source: str, variant: str | None = None) -> tuple[int, int]:
  """``(start, end)`` offsets in a config file's ``source`` of its figures table: the first
  paragraph of indented lines after the line naming this command (with ``--config=...:variant``
  for a variant)."""
  if variant is None:   # the first line naming the command without a variant
    found = re.compile(re.escape(COMMAND) + r"(?!\s+--config=\S*:\w)").search(source)
    at = -1 if found is None else found.start()
  else:
    found = re.compile(re.escape(COMMAND) + r"\s+--config=\S*:" + re.escape(variant) + r"\b").search(source)
    at = -1 if found is None else found.start()
  if at < 0:
    named = COMMAND if variant is None else f"{COMMAND} --config=...:{variant}"
    raise ValueError(f"the docstring names no `{named}` command before its figures table")
  m = re.compile(r"\n[ \t]*\n((?:  \S.*\n)+)").search(source, at)
  if m is None:
    raise ValueError(f"no indented table follows the line naming `{COMMAND}`")
  return m.start(1), m.end(1)


Rows = Mapping[tuple[str, str], Sequence[float]]


def compare(stated: Rows, printed: Rows, columns: Sequence[Column]) -> list[str]:
  """Every difference beyond a column's tolerance, a row stated but not printed, or printed but
  not stated, as one line each (empty: the docstring holds)."""
  problems = []
  for key in stated:
    if key not in printed:
      problems.append(f"{' '.join(key)}: in the docstring, not printed")
  for key, values in printed.items():
    if key not in stated:
      problems.append(f"{' '.join(key)}: printed, not in the docstring")
      continue
    for c, new, old in zip(columns, values, stated[key], strict=True):
      if math.isnan(new) and math.isnan(old):
        continue
      if math.isnan(new) or math.isnan(old) or abs(new - old) > c.tolerance + 1e-9:
        problems.append(f"{' '.join(key)} {c.header}: docstring {old}, printed {new} "
                        f"(tolerance {c.tolerance})")
  return problems


def run_config(path: str) -> dict[str, Any]:
  """Runs the config file as ``python -m fedtree.main --config=path`` would (in a temporary
  workdir, no plots); returns its results."""
  from fedtree.experiment.runner import train_and_evaluate

  file, variant = split_variant(path)
  module = load_module(file)
  config = module.get_config() if variant is None else module.get_config(variant)
  with config.unlocked():
    config.plots = False
    config.progress = False
  with tempfile.TemporaryDirectory() as workdir:
    return train_and_evaluate(config, workdir)


def check(path: str, *, write: bool = False, results=None) -> tuple[list[str], str]:
  """Runs the config at ``path`` (unless its ``results`` are given) and compares its figures with
  its docstring's; returns the differences (:func:`compare`) and the table of the figures
  printed. With ``write`` the docstring's table is replaced by that table (no differences)."""
  module = load_module(path)
  file, variant = split_variant(path)
  columns = columns_of(module, variant)
  if results is None:
    results = run_config(path)
  kind = table_of(module, variant)
  if kind != "models" and not is_sweep(results):
    raise ValueError(f"{path}: FIGURES_TABLE={kind!r} is a table of swept runs, and its runs are not swept")
  if kind == "runs":
    table, parse = sweep_table(results, columns), parse_sweep_table
  elif kind == "swept":
    table, parse = swept_models_table(results), parse_swept_models
  elif kind == "best":
    table, parse = best_table(results, columns), parse_best
  else:
    table = format_table(measure(results, columns), columns)
  with open(file, encoding="utf-8") as f:
    source = f.read()
  start, end = find_table(source, variant)
  if write:
    with open(file, "w", encoding="utf-8") as f:
      f.write(source[:start] + table + "\n" + source[end:])
    return [], table
  if kind != "models":
    diff = compare_best if kind == "best" else compare_sweeps
    return diff(parse(source[start:end], columns), parse(table, columns), columns), table
  return compare(parse_table(source[start:end], columns), measure(results, columns), columns), table


SWEPT_CELL = re.compile(r"^(-?[\d.]+) ± (-?[\d.]+)(?: \((\d+)/\d+ seeds\))?$")


def is_sweep(results: Mapping[str, Any]) -> bool:
  """Whether ``results`` are a config's sweeps over seeds (every run's has a ``"sweep"``)."""
  return bool(results) and all(isinstance(r, Mapping) and "sweep" in r for r in results.values())


def sweep_table(results: Mapping[str, Any], columns: Sequence[Column]) -> str:
  """The runs table a swept config prints last (:func:`fedtree.experiment.sweep.format_runs_table`
  of the columns' metrics), two-space indented as the docstring holds it."""
  from fedtree.experiment.sweep import format_runs_table

  keys = [c.key for c in columns]
  if not all(isinstance(k, str) for k in keys):
    raise ValueError("a swept config's FIGURES keys are the metrics of its runs table (strings)")
  lines = format_runs_table(dict(results), keys).split("\n")[2:]   # (a blank line and the title first)
  return "\n".join(f"  {line}".rstrip() for line in lines)


def parse_sweep_table(text: str, columns: Sequence[Column]) -> dict[str, list[tuple | None]]:
  """``{run: [(mean, std, seeds that reached | None) | None per column]}`` of a runs table (its
  second line the dashes that mark the columns; ``-``: no value)."""
  lines = [line for line in text.strip("\n").split("\n") if line.strip()]
  if len(lines) < 2 or set(lines[1].strip()) - {"-", " "}:
    raise ValueError("a runs table is a header, a line of dashes, then a row per run")
  spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[1])]
  if len(spans) != 2 + len(columns):
    raise ValueError(f"the runs table has {len(spans)} columns, expected {2 + len(columns)} (run, seeds, "
                     f"{', '.join(str(c.key) for c in columns)})")
  rows = {}
  for line in lines[2:]:
    ends = [start for start, _ in spans[1:]] + [len(line)]
    cells = [line[start:end].strip() for (start, _), end in zip(spans, ends, strict=True)]
    rows[cells[0]] = [_cell(cell) for cell in cells[2:]]
  return rows


def _cell(text: str) -> tuple | None:
  """A swept table's cell: ``(mean, std, seeds that reached | None)``, ``(value, None, None)`` for a
  plain number, ``None`` for ``-``."""
  if text == "-":
    return None
  m = SWEPT_CELL.match(text)
  if m is not None:
    return float(m[1]), float(m[2]), None if m[3] is None else int(m[3])
  try:
    return float(text), None, None
  except ValueError:
    raise ValueError(f"swept table cell {text!r}: not 'mean ± std [(k/n seeds)]', a number or '-'") from None


def study_updates(out: Mapping[str, Any]) -> float:
  """The client updates a swept run's study took: every setting's seeds (Hyperband: its brackets')."""
  if "client_updates" in out:
    return float(out["client_updates"])
  return float(sum(r["mean"].get("client_updates", 0.0) * r["seeds"] for r in out["settings"]))


def best_table(results: Mapping[str, Any], columns: Sequence[Column]) -> str:
  """A tuning study's table (``FIGURES_TABLE = "best"``): a row per run, its best setting (as the
  command names it, without the ``runs.<run>.`` of the run's own fields), that setting's mean of the
  study's metric and the client updates of the study; ``columns``: the metric's and the updates'
  (headers, decimals, tolerances)."""
  if len(columns) != 2:
    raise ValueError(f"FIGURES_TABLE='best' has two figure columns, the best setting's metric and the "
                     f"study's client updates ({len(columns)} given)")
  body = []
  for label, entry in results.items():
    out = entry["sweep"]
    best = out.get("best") or {}
    value = "-" if not best else f"{best['mean']:.{columns[0].decimals}f}"
    name = best.get("name", "-").replace(f"runs.{label}.", "")   # (the row names the run)
    body.append([label, name, value, f"{study_updates(out):.{columns[1].decimals}f}"])
  head = ["run", "best setting", columns[0].header, columns[1].header]
  widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
  return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                   for r in [head, *body])


def parse_best(text: str, columns: Sequence[Column]) -> dict[str, list]:
  """``{run: [best setting, (metric,), (updates,)]}`` of a :func:`best_table` (cells two or more
  spaces apart)."""
  rows = {}
  for line in [line.strip() for line in text.strip("\n").split("\n") if line.strip()][1:]:
    cells = re.split(r"\s{2,}", line)
    if len(cells) != 4:
      raise ValueError(f"a best-setting row has {len(cells)} cells, expected 4 (run, setting, "
                       f"{columns[0].header}, {columns[1].header}): {line!r}")
    rows[cells[0]] = [cells[1], _cell(cells[2]), _cell(cells[3])]
  return rows


def compare_best(stated: Mapping[str, list], printed: Mapping[str, list], columns: Sequence[Column]
                 ) -> list[str]:
  """:func:`compare_sweeps` for a study's best settings: the same setting, the figures within their
  tolerances."""
  problems = [f"{run} best setting: docstring {stated[run][0]}, printed {row[0]}"
              for run, row in printed.items() if run in stated and stated[run][0] != row[0]]
  return problems + compare_sweeps({k: v[1:] for k, v in stated.items()},
                                   {k: v[1:] for k, v in printed.items()}, columns)


SWEPT_MODELS = ("mean ± std", "worst 10 % mean ± std", "up MB", "down MB")
"""The figure columns of :func:`fedtree.experiment.sweep.runs_table` (``FIGURES_TABLE = "swept"``)."""


def swept_models_table(results: Mapping[str, Any]) -> str:
  """The table of every swept run's models a config prints last without ``sweep.columns``
  (:func:`fedtree.experiment.sweep.runs_table`), two-space indented."""
  from fedtree.experiment.sweep import runs_table

  return "\n".join(f"  {line}".rstrip() for line in runs_table(dict(results)).split("\n"))


def parse_swept_models(text: str, columns: Sequence[Column]) -> dict[str, list[tuple | None]]:
  """``{"run setting model metric": [cell per figure column]}`` of a :func:`swept_models_table` (a
  title line, a header, a row per run, setting and model; cells two or more spaces apart)."""
  lines = [line.strip() for line in text.strip("\n").split("\n") if line.strip()]
  if len(columns) != len(SWEPT_MODELS):
    raise ValueError(f"FIGURES_TABLE='swept' has the columns {SWEPT_MODELS}: FIGURES gives their tolerances "
                     f"in that order ({len(columns)} given)")
  if len(lines) < 2 or re.split(r"\s{2,}", lines[1])[4:] != list(SWEPT_MODELS):
    raise ValueError(f"a swept table is a title, the header run setting model metric "
                     f"{' '.join(SWEPT_MODELS)}, then a row per run's model")
  rows = {}
  for line in lines[2:]:
    cells = re.split(r"\s{2,}", line)
    if len(cells) != 4 + len(SWEPT_MODELS):
      raise ValueError(f"a swept table's row has {len(cells)} cells, expected {4 + len(SWEPT_MODELS)}: "
                       f"{line!r}")
    rows[" ".join(cells[:4])] = [_cell(c) for c in cells[4:]]
  return rows


def _shown(cell: tuple | None) -> str:
  if cell is None:
    return "-"
  if cell[1] is None:
    return f"{cell[0]}"
  return f"{cell[0]} ± {cell[1]}" + ("" if cell[2] is None else f" ({cell[2]} seeds reached)")


def compare_sweeps(stated: Mapping[str, list], printed: Mapping[str, list], columns: Sequence[Column]
                   ) -> list[str]:
  """:func:`compare` for runs tables: the mean and the std of every cell within the column's
  tolerance, the same seeds reaching a target, the same cells empty."""
  problems = [f"{run}: in the docstring, not printed" for run in stated if run not in printed]
  for run, values in printed.items():
    if run not in stated:
      problems.append(f"{run}: printed, not in the docstring")
      continue
    for c, new, old in zip(columns, values, stated[run], strict=True):
      if new is None and old is None:
        continue
      if (new is None or old is None or abs(new[0] - old[0]) > c.tolerance + 1e-9 or new[2] != old[2]
          or (new[1] is None) != (old[1] is None)
          or (new[1] is not None and abs(new[1] - old[1]) > c.tolerance + 1e-9)):
        problems.append(f"{run} {c.header}: docstring {_shown(old)}, printed {_shown(new)} "
                        f"(tolerance {c.tolerance})")
  return problems


CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")

QUICK = ("clustered:digits+beta_sweep", "compression", "heterogeneous", "mobility", "personalization",
         "personalized:quick", "pfedmt_mnist", "pfedmt_synthetic", "systems")
"""The configs ``--all --quick`` checks: each states figures a quiet 2-core machine reproduces in about
a minute or less (a name: its plain run and its variants; ``name:variant``: that variant alone)."""


def with_figures(quick: bool = False) -> list[str]:
  """Every config file (``configs/<name>.py``, ``configs/<folder>/<name>.py``) that states figures (a
  module-level ``FIGURES``): its plain run unless ``PLAIN_FIGURES = False``, and each of its variants
  with a table of its own (``FIGURE_VARIANTS``: ``configs/<name>.py:<variant>``); with ``quick`` only
  those of :data:`QUICK`."""
  out = []
  files = glob.glob(os.path.join(CONFIGS, "*.py")) + glob.glob(os.path.join(CONFIGS, "*", "*.py"))
  for path in sorted(files):
    with open(path, encoding="utf-8") as f:
      if "\nFIGURES = " not in f.read():
        continue
    module, name = load_module(path), os.path.basename(path)[:-3]
    runs = [(path, name)] if getattr(module, "PLAIN_FIGURES", True) else []
    runs += [(f"{path}:{v}", f"{name}:{v}") for v in getattr(module, "FIGURE_VARIANTS", ())]
    out += [run for run, short in runs if not quick or name in QUICK or short in QUICK]
  return out


def check_all(paths: Sequence[str]) -> int:
  """Checks every config of ``paths`` in turn, printing one line each; the configs whose figures
  moved (0: none)."""
  moved = 0
  for path in paths:
    problems, _ = check(path)
    for p in problems:
      print(f"differs: {os.path.relpath(path)}: {p}")
    said = "figures hold" if not problems else f"{len(problems)} figure(s) differ"
    print(f"{os.path.relpath(path)}: {said}", flush=True)
    moved += bool(problems)
  return moved


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", help="a config file, e.g. configs/fedkws.py")
  parser.add_argument("--all", action="store_true", help="check every config that states figures")
  parser.add_argument("--quick", action="store_true", help="with --all: only the quick ones (QUICK)")
  parser.add_argument("--write", action="store_true", help="rewrite the docstring's table")
  args = parser.parse_args(argv)
  if args.all == (args.config is not None):
    parser.error("give --config=<file> or --all")
  if args.all:
    if args.write:
      parser.error("--write rewrites one config's table: give --config=<file>")
    paths = with_figures(quick=args.quick)
    moved = check_all(paths)
    print(f"{len(paths) - moved} of {len(paths)} configs hold their figures")
    return 1 if moved else 0
  if args.quick:
    parser.error("--quick is for --all")
  # (refuses a config without FIGURES before running it)
  columns = columns_of(load_module(args.config), split_variant(args.config)[1])
  problems, table = check(args.config, write=args.write)
  print(table)
  if args.write:
    print(f"wrote the table above into {args.config}")
    return 0
  for p in problems:
    print(f"differs: {p}")
  print(f"{args.config}: {'figures hold' if not problems else f'{len(problems)} figure(s) differ'} "
        f"(tolerances: {', '.join(f'{c.header} {c.tolerance:g}' for c in columns)})")
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
