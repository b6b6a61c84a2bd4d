"""The rows a run writes (``<workdir>/metrics.jsonl``) as curves: read back (a resumed run's
repeated rounds, a sweep's experiments), averaged over seeds, and the runs, models and simulated
times in them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

Curve = tuple[np.ndarray, np.ndarray]  # (rounds int[R], values float[R])


def read_metrics(path: str) -> list[dict[str, Any]]:
  """The records of a ``metrics.jsonl`` file (or of ``<path>/metrics.jsonl`` for a directory).

  A resumed run appends to the file; where a ``(run, round)`` pair repeats, the last record wins.
  Blank or truncated lines (a run killed while writing) are skipped. The rows of a sweep (one per
  experiment and round, with ``setting`` and ``seed``) become a run each, labelled by the sweep's
  run and the setting (``"fedprox [mu=0.1]"``; ``"... seed 1"`` when the sweep has several
  seeds; a run swept over seeds alone is ``"fedprox seed 1"``), so that every experiment is its
  own curve (:func:`plot_sweep` draws the mean over seeds, :func:`seed_means` averages them), with
  its sweep's run label as ``sweep_run``.
  """
  if os.path.isdir(path):
    path = os.path.join(path, "metrics.jsonl")
  records: dict[tuple[str, Any, int], dict[str, Any]] = {}
  with open(path) as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError:
        continue
      if "run" in rec and "round" in rec:
        records[(str(rec["run"]), rec.get("experiment"), int(rec["round"]))] = rec
  seeds: dict[str, set[Any]] = {}
  for rec in records.values():
    if "setting" in rec:
      seeds.setdefault(_sweep_run(rec), set()).add(rec.get("seed"))
  out = []
  for rec in records.values():
    if "setting" in rec:
      base = _sweep_run(rec)
      label = f"{base} [{setting_label(rec['setting'])}]" if rec["setting"] else base
      rec = {**rec, "run": label if len(seeds[base]) == 1 else f"{label} seed {rec.get('seed')}",
             "sweep_run": base}
    out.append(rec)
  return out


def _sweep_run(rec: Mapping[str, Any]) -> str:
  """The run a sweep's row belongs to (its label without a ``#chunk<k>`` of a chunked sweep)."""
  return str(rec["run"]).split("#chunk", 1)[0]


def setting_label(setting: Mapping[str, Any]) -> str:
  """``{"runs.fedprox.mu": 0.1}`` -> ``"mu=0.1"``: a sweep setting in a legend."""
  return ",".join(f"{k.rsplit('.', 1)[-1]}={v:g}" for k, v in sorted(setting.items())) or "default"


def runs(records: Iterable[Mapping[str, Any]]) -> list[str]:
  """Run labels in order of first appearance."""
  return list(dict.fromkeys(str(r["run"]) for r in records))


def models_of(records: Iterable[Mapping[str, Any]], metric: str = "accuracy") -> list[str]:
  """Model names that report ``metric`` (keys ``<model>/<metric>``), in order of appearance."""
  suffix = "/" + metric
  return list(dict.fromkeys(k[: -len(suffix)] for r in records for k in r if k.endswith(suffix)))


def curve(records: Iterable[Mapping[str, Any]], run: str, key: str) -> Curve:
  """``(rounds, values)`` of ``key`` (e.g. ``"global/accuracy"`` or ``"train_loss"``) in ``run``,
  sorted by round; reports without the key (or with ``null``) are left out."""
  pts = sorted((int(r["round"]), float(r[key])) for r in records
               if str(r["run"]) == run and r.get(key) is not None and not isinstance(r[key], list))
  if not pts:
    return np.zeros(0, np.int64), np.zeros(0)
  rounds, values = zip(*pts, strict=True)
  return np.asarray(rounds), np.asarray(values)


def seed_means(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The rows of a sweep over several seeds (``setting`` and ``seed``, :func:`read_metrics`'s
  ``"<run> [<setting>] seed <s>"`` runs) as one run per setting: every number the mean over
  seeds, its spread as ``<key>:std``, labelled ``"<run> [<setting>] (mean of N seeds)"``; other
  rows unchanged. What a picture of many seeds draws (a line per setting, not per seed)."""
  groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
  out: list[dict[str, Any]] = []
  for r in records:
    label = str(r["run"])
    if "setting" not in r or " seed " not in label:
      out.append(dict(r))
      continue
    groups.setdefault((label.rsplit(" seed ", 1)[0], int(r["round"])), []).append(r)
  seeds: dict[str, set] = {}
  for (base, _), rows in groups.items():
    seeds.setdefault(base, set()).update(r.get("seed") for r in rows)
  for (base, rnd), rows in groups.items():
    row: dict[str, Any] = {"run": f"{base} (mean of {len(seeds[base])} seeds)", "round": rnd,
                           "sweep_run": rows[0].get("sweep_run"), "setting": rows[0]["setting"]}
    keys = dict.fromkeys(k for r in rows for k, v in r.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)
                         and k not in ("round", "seed", "experiment"))
    for k in keys:
      vals = np.asarray([float(r[k]) for r in rows if isinstance(r.get(k), (int, float))], np.float64)
      row[k] = float(vals.mean())
      row[f"{k}:std"] = float(vals.std())
    out.append(row)
  return out


def fairness_keys(records: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
  """``(model, metric)`` pairs whose per-client spread the rows report over rounds
  (``<model>/<metric>_worst10_mean``, the runner's per-round fairness), in order of appearance."""
  suffix = "_worst10_mean"
  keys = dict.fromkeys(k[: -len(suffix)] for r in records for k in r if k.endswith(suffix) and "/" in k)
  return [tuple(k.split("/", 1)) for k in keys]   # type: ignore[misc]


def time_curve(records: Iterable[Mapping[str, Any]], run: str, key: str, *,
               time_key: str = "sim_seconds") -> Curve:
  """``(simulated hours, values)`` of ``key`` in ``run``: the reports that carry both ``key`` and
  the simulated clock ``time_key`` (seconds; :mod:`fedtree.toolbox.systems`), sorted by time."""
  pts = sorted((float(r[time_key]) / 3600.0, float(r[key])) for r in records
               if str(r["run"]) == run and r.get(key) is not None and r.get(time_key) is not None
               and not isinstance(r[key], list))
  if not pts:
    return np.zeros(0), np.zeros(0)
  hours, values = zip(*pts, strict=True)
  return np.asarray(hours), np.asarray(values)


def time_to_target(records: Iterable[Mapping[str, Any]], run: str, key: str, target: float, *,
                   time_key: str = "sim_seconds") -> float | None:
  """The first simulated hour at which ``key`` of ``run`` reached ``target`` (``None``: never).

  Example:
    >>> recs = [{"run": "a", "round": r, "sim_seconds": 1800.0 * r, "global/accuracy": 0.2 * r}
    ...         for r in (1, 2, 3)]
    >>> time_to_target(recs, "a", "global/accuracy", 0.4), time_to_target(recs, "a", "global/accuracy", 0.9)
    (1.0, None)
  """
  hours, values = time_curve(records, run, key, time_key=time_key)
  hit = np.flatnonzero(values >= target)
  return float(hours[hit[0]]) if hit.size else None


def frozen_models(records: Sequence[Mapping[str, Any]], metric: str = "accuracy") -> set[tuple[str, str]]:
  """``(run, model)`` pairs whose ``metric`` never changed over several reports (e.g. the root
  of a tree whose root never aggregates: an untrained model, not a result)."""
  out = set()
  for run in runs(records):
    for m in models_of([r for r in records if r["run"] == run], metric):
      _, y = curve(records, run, f"{m}/{metric}")
      if y.size > 1 and np.all(y == y[0]):
        out.add((run, m))
  return out
