r"""Tuning 81 settings (issue 53): successive halving in one program vs the grid in one program vs 81
separate runs of fedtree.

  python -m benchmarks.tuning --out=benchmarks/results/tuning.json   # 9 of the 81 separate runs timed
  python -m benchmarks.tuning --rounds=6 --rungs=2,4 --separate=2 --seeds=2   # a check that it runs

FedAvg of ``configs/tuning.py`` (the quickstart's task, 10 clients a round, 9 client x 9 server
learning rates), each side through the experiment runner as a user runs it (no workdir, nothing
printed):

* ``separate``: every setting as a run of its own (``config.sweep`` empty, the setting applied: a
  freshly built algorithm, so each compiles), as a tuner driving one fedtree run per setting does;
  ``--separate=K`` times K of them (spread over the grid) and scales their wall time to 81;
* ``grid``: the 81 settings as one compiled program to the last round;
* ``halving``: the 81 settings in one program, the worse two thirds stopped at each rung
  (``--rungs``, rate 3) and the program compacted to the survivors.

Printed, for each: wall time (its ratio to ``separate``'s), the client updates it trained, and the
best setting it finds; then the best settings of the grid and of halving rerun over ``--seeds`` seeds
(one program), whose spread is the seed noise the two are compared within.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def _config(rounds: int, progress: bool = False):
  from configs.tuning import get_config

  c = get_config()
  c.rounds, c.progress = int(rounds), progress
  c.eval_every = c.rounds_per_call = min(int(c.eval_every), int(rounds))
  del c.runs.fedprox
  c.run_order = ("fedavg",)
  c.sweep.params = c.sweep.params.split(";runs.fedprox")[0]
  return c


def _run(c) -> tuple[float, dict]:
  import contextlib
  import io

  from fedtree import experiment

  t = time.perf_counter()
  with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    out = experiment.train_and_evaluate(c, None)
  return time.perf_counter() - t, out["fedavg"]


def _best(sw: dict) -> dict:
  b = sw["best"]
  row = next(r for r in sw["settings"] if r["name"] == b["name"])
  return {"setting": b["setting"], "accuracy": b["mean"], "rounds": row.get("rounds")}


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rounds", type=int, default=90)
  p.add_argument("--rungs", default="10,30")
  p.add_argument("--separate", type=int, default=9, help="separate runs timed (scaled to all settings)")
  p.add_argument("--seeds", type=int, default=4, help="seeds of the best settings' rerun")
  p.add_argument("--out", default=None)
  a = p.parse_args(argv)
  from fedtree.experiment import sweep

  _run(_config(1))   # warm-up: imports and the data, outside every timing
  base = _config(a.rounds)
  settings = sweep.settings_of(base, "fedavg")
  n = len(settings)
  out: dict = {"rounds": a.rounds, "rungs": a.rungs, "settings": n}

  c = _config(a.rounds)
  c.sweep.rungs = a.rungs
  wall, res = _run(c)
  updates = sum(r["mean"]["client_updates"] for r in res["sweep"]["settings"])
  out["halving"] = {"wall_s": wall, "client_updates": updates, "best": _best(res["sweep"])}

  wall, res = _run(_config(a.rounds))
  updates = sum(r["mean"]["client_updates"] for r in res["sweep"]["settings"])
  out["grid"] = {"wall_s": wall, "client_updates": updates, "best": _best(res["sweep"])}

  picked = sorted({round(i * (n - 1) / max(1, a.separate - 1)) for i in range(min(a.separate, n))})
  walls, accs = [], {}
  for i in picked:
    c = _config(a.rounds)
    c.sweep.params = ""
    for path, value in settings[i].items():
      sweep._set_path(c, path, value)
    wall, res = _run(c)
    walls.append(wall)
    accs[i] = float(res["global"]["accuracy"])   # (a run of its own: the grid's client updates, one by one)
  best_i = max(accs, key=accs.get)
  out["separate"] = {"wall_s": float(np.sum(walls)) * n / len(picked), "timed": len(picked),
                     "client_updates": out["grid"]["client_updates"],
                     "best": {"setting": settings[best_i], "accuracy": accs[best_i]}}

  # the seed noise: the grid's and halving's best settings over --seeds seeds, in one program
  both = [out["grid"]["best"]["setting"], out["halving"]["best"]["setting"]]
  c = _config(a.rounds)
  c.sweep.seeds, c.sweep.mode = a.seeds, "zip"
  c.sweep.params = ";".join(f"{p}=" + ",".join(str(s[p]) for s in both) for p in sorted(both[0]))
  _, res = _run(c)
  rows = res["sweep"]["settings"]
  acc = "global/accuracy"
  out["seeds"] = {"grid_best": {"mean": rows[0]["mean"][acc], "std": rows[0]["std"][acc]},
                  "halving_best": {"mean": rows[-1]["mean"][acc], "std": rows[-1]["std"][acc]}}
  sep = out["separate"]["wall_s"]
  print(f"{n} settings of FedAvg, {a.rounds} rounds of 10 clients (configs/tuning.py); wall time as a "
        f"ratio of {n} separate runs ({sep:.1f} s, {out['separate']['timed']} timed)")
  print(f"{'':10} {'wall s':>8} {'speedup':>8} {'client updates':>15} {'fraction':>9}  "
        "best setting (its accuracy)")
  for name in ("separate", "grid", "halving"):
    r = out[name]
    b = r["best"]
    setting = sweep.setting_name(b["setting"])
    print(f"{name:10} {r['wall_s']:8.1f} {sep / r['wall_s']:7.1f}x {r['client_updates']:15.0f} "
          f"{r['client_updates'] / out['grid']['client_updates']:8.0%}  {setting} ({b['accuracy']:.4f})")
  g, h = out["seeds"]["grid_best"], out["seeds"]["halving_best"]
  print(f"over {a.seeds} seeds: the grid's best {g['mean']:.4f} ± {g['std']:.4f}, halving's best "
        f"{h['mean']:.4f} ± {h['std']:.4f} (difference {h['mean'] - g['mean']:+.4f})")
  if a.out:
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
      json.dump(out, f, indent=2)
  return out


if __name__ == "__main__":
  main()
