"""Every float32 value in a traced program (issue 57): :func:`float32_sites` walks a jaxpr, and every
jaxpr inside it (scan, while, cond, pjit, custom_jvp/vjp, remat, ...), and lists each float32 variable
an equation writes, each float32 literal it reads and each float32 constant the program closes over,
with the primitive and the line of source that made it. Under ``jax_enable_x64`` a round whose state
is float64 should list none (``--config.dtype=float64`` is float64 end to end)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np


class Site(NamedTuple):
  primitive: str   # the equation's primitive ("const" for a closed-over constant)
  what: str        # "out" (a variable the equation writes), "literal" (one it reads) or "const"
  where: str       # file:line of the user code that traced it (fedtree's frames first)


def _source(eqn) -> str:
  try:
    from jax._src import source_info_util

    frames = list(source_info_util.user_frames(eqn.source_info.traceback))
    ours = [f for f in frames if "/fedtree/" in f.file_name] or frames
    return f"{ours[0].file_name.split('/fedtree/')[-1]}:{ours[0].start_line}" if ours else "?"
  except Exception:  # noqa: BLE001 -- a private API: a missing frame only loses the location
    return "?"


def _sub_jaxprs(value: Any) -> Iterator[Any]:
  """The jaxprs (open or closed) inside an equation's parameter."""
  if hasattr(value, "eqns"):
    yield value
  elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
    yield value
  elif isinstance(value, (tuple, list)):
    for v in value:
      yield from _sub_jaxprs(v)


def _is_f32(aval) -> bool:
  return getattr(aval, "dtype", None) == np.float32


def float32_sites(jaxpr) -> list[Site]:
  """Every float32 value of ``jaxpr`` (a ``ClosedJaxpr`` from ``jax.make_jaxpr`` or a ``Jaxpr``) and
  of every jaxpr nested in its equations' parameters."""
  out: list[Site] = []
  consts = getattr(jaxpr, "consts", ())
  inner = jaxpr.jaxpr if hasattr(jaxpr, "consts") else jaxpr
  for c in consts:
    if getattr(c, "dtype", None) == np.float32:
      out.append(Site("const", "const", "?"))
  for eqn in inner.eqns:
    name = eqn.primitive.name
    for v in eqn.outvars:
      if _is_f32(v.aval):
        out.append(Site(name, "out", _source(eqn)))
    for v in eqn.invars:
      if hasattr(v, "val") and _is_f32(v.aval):   # a Literal
        out.append(Site(name, "literal", _source(eqn)))
    for p in eqn.params.values():
      for sub in _sub_jaxprs(p):
        out.extend(float32_sites(sub))
  return out


def summary(sites: list[Site]) -> list[str]:
  """One line per distinct ``(primitive, what, where)``, with its count, sorted."""
  counts: dict[Site, int] = {}
  for s in sites:
    counts[s] = counts.get(s, 0) + 1
  return sorted(f"{s.where} {s.primitive} {s.what} x{n}" for s, n in counts.items())


CAPABILITY_CASES = {
  "dp": ("fedavg", dict(weighting="uniform", privacy=dict(clip_norm=1.0, noise_multiplier=1.0))),
  "dp_adaptive": ("fedavg", dict(weighting="uniform", privacy=dict(
    clip_norm=1.0, noise_multiplier=1.0,
    adaptive=dict(target_quantile=0.5, learning_rate=0.2, count_noise=5.0)))),
  "qsgd": ("fedavg", dict(compression=dict(uplink=dict(name="qsgd", bits=8)))),
  "topk": ("fedavg", dict(compression=dict(uplink=dict(name="topk", k=3)))),
  "krum": ("fedavg", dict(cohort_size=5, aggregator=dict(name="krum", f=1))),
  "systems": ("hierfavg", dict(systems=dict(speed=dict(dist="lognormal", median=2.0, sigma=1.0),
                                            policy=dict(kind="deadline", seconds=3.0)))),
  "fedbuff_systems": ("fedbuff", dict(systems=dict(speed=dict(dist="lognormal", median=2.0, sigma=1.0)))),
  "feddyn_by_size": ("feddyn", dict(alpha_by_data_size=True)),
  "mobility": ("hierfavg", dict(cohort_size=2, weighting="uniform", mobility=dict(
    model="markov", dwell=2.0, failures=dict(rate=0.3, repair=1)),
    privacy=dict(clip_norm=1.0, noise_multiplier=1.0))),
}
"""Runs with a capability (privacy, compression, a robust aggregator, a systems model) or an option
that brings its own constants (FedDyn's α n̄ / n_i) beside the registered algorithms' own cases:
``label: (algorithm, fields)``."""


def x64_round_sites(label: str) -> tuple[set[str], list[str]]:
  """``(state dtypes, float32 sites)`` of one round of run ``label`` (an algorithm of
  ``helpers.ALGORITHM_CASES`` or a :data:`CAPABILITY_CASES` label) built by the registry on the tests'
  small context in float64 (``config.dtype="float64"``: data and initial parameters). Call it under
  ``jax.enable_x64(True)``."""
  import dataclasses

  import jax
  import jax.numpy as jnp
  import ml_collections
  from helpers import ALGORITHM_CASES, small_context

  from fedtree.core.data import as_device
  from fedtree.experiment import registry
  from fedtree.experiment.context import as_float64

  assert jax.config.jax_enable_x64, "call under jax.enable_x64(True)"
  ctx = small_context()
  data, _, model = as_float64(ctx.data, None, ctx.model)
  ctx.config.dtype = "float64"
  ctx = dataclasses.replace(ctx, data=as_device(data), model=model)
  name, fields = CAPABILITY_CASES.get(label, (label, {}))
  run = ml_collections.ConfigDict({"algorithm": name, "chunk_size": 3, **ALGORITHM_CASES[name], **fields})
  alg = registry.build_algorithm(label, run, ctx)
  state = alg.init(jax.random.key(0))
  dtypes = {str(a.dtype) for a in jax.tree.leaves(state) if jnp.issubdtype(a.dtype, jnp.floating)}
  return dtypes, summary(float32_sites(jax.make_jaxpr(alg.round)(state, ctx.data, jax.random.key(1))))
