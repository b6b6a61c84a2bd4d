"""B-HFL's run fields (paper 001): the converters of its config-only fields and its spec.

Experiment layer (they read config values); the algorithm is :mod:`fedtree.algorithms.hierarchical.bhfl`.
"""

from __future__ import annotations

import dataclasses

import optax

from fedtree import algorithms
from fedtree.algorithms.hierarchical.bhfl import proxy_from_clients, with_level_report
from fedtree.algorithms.hierarchical.bhfl.asynchrony import latency_from_config
from fedtree.experiment.builders import server_from_config
from fedtree.experiment.fields import field
from fedtree.experiment.spec import AlgorithmSpec, Fields, number, per_level_servers


# B-HFL's converters set only what the run gives; the rest is the factory's default.
def _bhfl_down(v, ctx):
  if "downs" in v or "down" in v:
    return per_level_servers("downs", "down", "down_optimizers").convert(v, ctx)
  return {"down_optimizers": optax.sgd(number(v["eta_down"]))} if "eta_down" in v else {}


def _bhfl_periods(v, ctx):
  periods = v.get("periods", None)
  if isinstance(periods, (list, tuple)):
    periods = [tuple(int(q) for q in p) if isinstance(p, (list, tuple)) else int(p) for p in periods]
  elif periods is not None:
    periods = int(periods)
  return {"periods": periods}


def _bhfl_proxy(v, ctx):
  """``proxy_examples`` per node of every level in ``proxy_levels`` (drawn from its subtree's
  clients); ``proxy_steps`` / ``proxy_batch_size`` replace those of the local schedule."""
  out = {}
  if v.get("proxy_examples", None):
    if "proxy_levels" not in v:
      raise ValueError(
        f"proxy_examples={v['proxy_examples']} needs proxy_levels, the server levels whose nodes "
        f"hold proxy data (e.g. (0,): the root)"
      )
    out["proxy"] = {int(lv): proxy_from_clients(ctx.data, ctx.topology, int(lv), int(v["proxy_examples"]),
                                                seed=int(ctx.config.seed) + int(lv))
                    for lv in v["proxy_levels"]}
  if "proxy" in out and "proxy_steps" not in v and isinstance(ctx.schedule.steps, (list, tuple)):
    raise ValueError(
      f"proxy_steps is needed: config.local.steps gives per-client step counts "
      f"({len(ctx.schedule.steps)} of them), which the proxy data (one set per node of "
      f"proxy_levels={tuple(v['proxy_levels'])}) cannot inherit; set proxy_steps, an int >= 1")
  if "proxy_steps" in v or "proxy_batch_size" in v:
    sched = ctx.schedule
    if "proxy_steps" in v:
      sched = dataclasses.replace(sched, epochs=None, steps=int(v["proxy_steps"]))
    if "proxy_batch_size" in v:
      sched = dataclasses.replace(sched, batch_size=int(v["proxy_batch_size"]))
    out["proxy_schedule"] = sched
  return out


def _bhfl_latency(v, ctx):
  if "latency" not in v:
    return {}
  lat = v["latency"]
  if isinstance(lat, (list, tuple)):
    return {"latencies": [latency_from_config(x) for x in lat]}
  return {"latencies": latency_from_config(lat)}


def _bhfl_buffers(v, ctx):
  if "buffer_sizes" not in v:
    return {}
  b = v["buffer_sizes"]
  if isinstance(b, (list, tuple)):
    return {"buffer_sizes": [None if x is None else int(x) for x in b]}
  return {"buffer_sizes": None if b is None else int(b)}


def _bhfl_residual(v, ctx):
  out = {}
  if "residual" in v:
    out["residual_optimizer"] = server_from_config(v["residual"])
  if "residual_down_eta" in v:
    out["residual_down_optimizer"] = optax.sgd(v["residual_down_eta"])
  return out


def _bhfl_report(alg, label, run, ctx):
  return with_level_report(alg, ctx.model, ctx.topology, central_test=ctx.central_test,
                           chunk_size=field(ctx.config, "eval_chunk_size"), label=label)


FIELDS = (
  per_level_servers("ups", "up", "up_optimizers"),
  Fields(("downs", "down", "eta_down"), _bhfl_down),
  Fields(("periods",), _bhfl_periods),
  Fields(("proxy_examples", "proxy_levels", "proxy_steps", "proxy_batch_size"), _bhfl_proxy),
  Fields(("latency",), _bhfl_latency),
  Fields(("buffer_sizes",), _bhfl_buffers),
  Fields(("residual", "residual_down_eta"), _bhfl_residual),
)

SPEC = AlgorithmSpec(algorithms.bhfl, fields=FIELDS, wrap=_bhfl_report)
