"""Running an algorithm: jitted rounds (fused with ``lax.scan``) and the one round loop.

The round key is ``fold_in(key, state.round)``, so a run is a pure function of the seed and
resumes bit-identically from a checkpoint, whatever the fusion. ``rounds_per_call`` rounds
run in one compiled call between host visits; the state buffers are donated.

:func:`run` is the only round loop of the package (the library, the experiment runner,
GroupPerFL's stages and the tests use it). Everything the caller wants done between calls
is an argument: the evaluation cadence (``eval_every`` + ``on_eval``), a checkpoint hook
(``on_call``), a metrics/progress hook (``on_metrics``), a stop request (``should_stop``,
e.g. set by a signal handler). Nothing here reads a config or writes a file.

Compiled fused-round functions are cached per ``(algorithm.round, rounds per call)``
(:func:`compile_rounds`), so calling :func:`run` again with ``state=...`` (stepping through
rounds from Python) or running stage after stage compiles once per distinct fuse length.

Divergence is checked inside the round: every fused round also returns whether the new
state is finite and within the divergence bound (``max_abs``, default :data:`DIVERGENCE_BOUND`:
a state that explodes but stays finite, e.g. a server learning rate of 1e30, is caught the
round it happens) and, if not, the first state leaf and row where it is not, named by the
state's own row names (:class:`fedtree.core.algorithm.RowName`: a server level's node or a
client), so the loop stops after that call naming run, round, level, node or client, before
``on_call`` (the checkpoint hook) sees the diverged state.
An algorithm whose round reports ``nonfinite_client`` (``int32[]``, the lowest id of a client
whose update was not finite, -1 if none; :class:`fedtree.core.tier.TierResult`) has that
client named first: a NaN in one client's update is averaged into its parent, where the state
check alone would only see the parent.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedtree.core.algorithm import UNNAMED, FederatedAlgorithm, RowName, state_row_names
from fedtree.core.data import FederatedData
from fedtree.core.rng import stream


class NonFiniteLossError(FloatingPointError):
  """Raised when a round's training loss, or the state it produced, is NaN or infinite."""


def init_key(key: jax.Array) -> jax.Array:
  """The key an algorithm's initial state is drawn from, given a run's root key (one rule
  for every entry point, so the same seed gives the same initial model everywhere)."""
  return stream(key, "init")


# ------------------------------------------------------------------------ finite checks
DIVERGENCE_BOUND = 1e15
"""The default largest ``|value|`` a state may hold (any float leaf: models, optimizer states,
per-client state) before the round counts as diverged; no trained model comes near it, while an
exploding one passes it long before float32 overflows (3.4e38)."""


def _float_leaves(state) -> list[tuple[str, RowName, jax.Array]]:
  """``(key path, row name, leaf)`` of every float leaf of ``state`` (row names: the state's
  own, :func:`fedtree.core.algorithm.state_row_names`)."""
  leaves = jax.tree_util.tree_flatten_with_path(state)[0]
  names = state_row_names(state)
  return [(jax.tree_util.keystr(p), name, x) for (p, x), name in zip(leaves, names, strict=True)
          if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]


def finite_flags(state, max_abs: float | None = None) -> dict[str, jax.Array]:
  """In-jit: ``state_finite`` (``bool[]``, every float leaf finite and, with ``max_abs``, within
  ``[-max_abs, max_abs]``), ``bad_leaf`` (``int32[]``, index of the first float leaf of
  ``state`` that is not, -1 if none), ``bad_row`` (``int32[]``, its first such row along axis 0:
  the node of a stacked server level, the client of per-client state; 0 for a scalar leaf) and
  ``bad_finite`` (``bool[]``: that row is finite, so it failed the bound only)."""
  leaves = _float_leaves(state)
  if not leaves:
    return {"state_finite": jnp.array(True), "bad_leaf": jnp.int32(-1), "bad_row": jnp.int32(-1),
            "bad_finite": jnp.array(False)}
  rows, finite_rows = [], []
  for _, _, x in leaves:
    fin = jnp.isfinite(x)
    ok = fin if max_abs is None else jnp.abs(x) <= max_abs  # NaN compares False: not ok either
    per_row = (lambda a: a.reshape(a.shape[0], -1).all(axis=1)) if x.ndim else (lambda a: a.reshape(1))  # noqa: E731
    rows.append(per_row(ok))
    finite_rows.append(per_row(fin))
  leaf_ok = jnp.stack([r.all() for r in rows])
  bad_leaf = jnp.where(leaf_ok.all(), -1, jnp.argmin(leaf_ok)).astype(jnp.int32)
  first_bad = [jnp.argmin(r) for r in rows]
  first_bad_row = jnp.stack(first_bad).astype(jnp.int32)
  first_bad_finite = jnp.stack([f[i] for f, i in zip(finite_rows, first_bad, strict=True)])
  at = jnp.maximum(bad_leaf, 0)
  bad_row = jnp.where(bad_leaf < 0, -1, first_bad_row[at])
  return {"state_finite": leaf_ok.all(), "bad_leaf": bad_leaf, "bad_row": bad_row,
          "bad_finite": (bad_leaf >= 0) & first_bad_finite[at]}


def diverged_part(state, max_abs: float | None = DIVERGENCE_BOUND) -> str | None:
  """On the host: ``None`` when every float leaf of ``state`` is finite and within ``max_abs``,
  else where it is not (e.g. ``server level 0, node 0 (state.params[0]['w']): |value| 1.6e+30``);
  how a restored checkpoint is checked before a run continues from it."""
  for path, name, x in _float_leaves(state):
    a = np.abs(np.asarray(jax.device_get(x), np.float64))
    flat = a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)
    bad = ~np.isfinite(flat) if max_abs is None else ~(flat <= max_abs)
    if bad.any():
      row = int(np.argmax(bad.any(axis=1)))
      return f"{describe_leaf(path, name, row)}: |value| {float(np.max(flat[row])):.3g}"
  return None


CHECK_KEYS = ("state_finite", "bad_leaf", "bad_row", "bad_finite", "nonfinite_client", "nonfinite_experiment")
"""Metrics the loop reads for its divergence check and does not pass on to ``on_metrics``."""


def describe_leaf(path: str, name: RowName, row: int, name_row: Callable[[int], str] | None = None) -> str:
  """Row ``row`` of the state leaf at ``path`` whose rows are ``name`` (the state's
  :class:`~fedtree.core.algorithm.RowName`): ``server level 1, node 3 (state.params[1]...)``.

  With ``name_row`` (a stacked state whose leaves' row is an experiment of a sweep):
  ``<name_row(row)>, server level 1 (state.inner.params[1]...)``.
  """
  if name_row is not None:
    return f"{name_row(row)}, {name.part()} (state{path})"
  if name == UNNAMED:
    return f"row {row} of state{path}"
  return f"{name.row(row)} (state{path})"


# ------------------------------------------------------------------------ compiled rounds
def make_multi_round(algorithm: FederatedAlgorithm, rounds_per_call: int,
                     check_state: bool = True, max_abs: float | None = DIVERGENCE_BOUND,
                     poll: Callable[[], Any] | None = None) -> Callable:
  """``(state, data, key) -> (state, metrics stacked [rounds_per_call])``, for ``jax.jit``.

  With ``check_state`` the metrics also hold :func:`finite_flags` of every round's new state
  (with the bound ``max_abs``; ``None``: finiteness only). With ``poll`` (a host function returning
  whether to stop: :class:`StopPoll`), every :func:`poll_every` rounds after the first the call asks
  it (``jax.experimental.io_callback``) and, once it says stop, the call's loop (a ``lax.while_loop``
  in place of the scan) ends: a stop request ends a call of many fused rounds after the round in
  progress (or within :func:`poll_every` rounds) instead of after the call. The rounds not run are
  those past ``state.round``; their metrics are zeros, which :func:`run` drops.
  """
  if int(rounds_per_call) < 1:
    raise ValueError(f"rounds_per_call={rounds_per_call} must be >= 1")

  def multi(state, data, key):
    def one(s):
      new, metrics = algorithm.round(s, data, jax.random.fold_in(key, s.round))
      if check_state:
        metrics = {**metrics, **finite_flags(new, max_abs)}
      return new, metrics

    if poll is None:
      return jax.lax.scan(lambda s, _: one(s), state, None, length=int(rounds_per_call))
    from jax.experimental import io_callback

    n, every = int(rounds_per_call), poll_every(int(rounds_per_call))
    shapes = jax.eval_shape(one, state)[1]

    def ask():
      return io_callback(poll, jax.ShapeDtypeStruct((), jnp.bool_), ordered=False)

    def body(carry):
      s, i, _, rows = carry
      s, metrics = one(s)
      rows = jax.tree.map(lambda r, m: r.at[i].set(m), rows, metrics)
      i = i + 1
      due = jnp.logical_and(i % every == 0, i < n)   # (a scalar cond: the round itself is not in one)
      return s, i, jax.lax.cond(due, ask, lambda: jnp.zeros((), jnp.bool_)), rows

    rows = jax.tree.map(lambda a: jnp.zeros((n,) + a.shape, a.dtype), shapes)
    start = (state, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.bool_), rows)
    state, _, _, rows = jax.lax.while_loop(lambda c: jnp.logical_and(c[1] < n, ~c[2]), body, start)
    return state, rows

  return multi


POLLS_PER_CALL = 25
"""At most about this many stop polls in a call (:func:`poll_every`): each is a host callback, so a call
of many tiny fused rounds asks every few rounds, not every one. What a stoppable call costs
(``python -m benchmarks.stop_poll``, 2-core CPU under load): 1.06x and 0.91x the plain program's time a
round for a 512-wide MLP's 18-21 ms rounds (the spread), 1.6-1.8x for a 16-wide MLP's 0.4-0.8 ms rounds
(about 0.4 ms a round, whose loop no longer runs as a plain scan)."""


def poll_every(rounds_per_call: int) -> int:
  """Rounds between a stoppable call's polls: 1 up to :data:`POLLS_PER_CALL` rounds a call (a stop
  ends it after the round in progress), then ``rounds_per_call // POLLS_PER_CALL``."""
  return max(1, int(rounds_per_call) // POLLS_PER_CALL)


class StopPoll:
  """The host side of a stoppable call (:func:`make_multi_round`'s ``poll``): ``should_stop`` (the
  loop's, set before every call by :func:`compile_rounds`) asked every :func:`poll_every` rounds."""

  def __init__(self) -> None:
    self.should_stop: Callable[[], bool] | None = None

  def __call__(self) -> np.ndarray:
    ask = self.should_stop
    return np.asarray(bool(ask is not None and ask()))


class CompileCache:
  """Jitted fused-round functions by ``(algorithm.round, rounds per call, donate, check, bound)``
  (the compiled program depends on the round function alone, so algorithms that share it, such
  as the chunks of a sweep, :func:`fedtree.core.sweep.sweep`, share their compiles); keeps the
  ``maxsize`` most recently used (each holds its algorithm's closures alive)."""

  def __init__(self, maxsize: int = 32):
    self.maxsize = int(maxsize)
    self._fns: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()

  def get(self, algorithm: FederatedAlgorithm, rounds_per_call: int, donate: bool = True,
          check_state: bool = True, max_abs: float | None = DIVERGENCE_BOUND,
          poll: StopPoll | None = None):
    """The jitted function; with ``poll`` the stoppable one, ``(fn, its StopPoll)`` (``poll`` is used
    when the function is made: a cached one keeps its own)."""
    key = (algorithm.round, int(rounds_per_call), bool(donate), bool(check_state), max_abs, poll is not None)
    with self._lock:
      try:
        fn = self._fns.pop(key)
      except TypeError:  # an unhashable round (a callable object): no caching
        return _jit(algorithm, rounds_per_call, donate, check_state, max_abs, poll)
      except KeyError:
        fn = _jit(algorithm, rounds_per_call, donate, check_state, max_abs, poll)
      self._fns[key] = fn
      while len(self._fns) > self.maxsize:
        self._fns.popitem(last=False)
      return fn

  def clear(self) -> None:
    with self._lock:
      self._fns.clear()


def _jit(algorithm, rounds_per_call, donate, check_state, max_abs=DIVERGENCE_BOUND, poll=None):
  fn = jax.jit(make_multi_round(algorithm, rounds_per_call, check_state, max_abs, poll),
               donate_argnums=(0,) if donate else ())
  return fn if poll is None else (fn, poll)


COMPILED = CompileCache()
"""The process-wide cache :func:`compile_rounds` and :func:`run` use (``COMPILED.clear()``
frees it)."""


def compile_rounds(algorithm: FederatedAlgorithm, rounds_per_call: int = 1, *, donate: bool = True,
                   check_state: bool = False, cache: CompileCache | None = COMPILED,
                   max_abs: float | None = DIVERGENCE_BOUND, should_stop: Callable[[], bool] | None = None):
  """The jitted fused-round function (state buffers donated), from ``cache`` when given.

  With ``should_stop`` and several rounds a call in one process, the stoppable program
  (:func:`make_multi_round`'s ``poll``) asking ``should_stop`` once a round: a stop ends the call
  after the round in progress. Over several processes the call runs whole (they agree on stopping
  between calls, :func:`fedtree.core.sharding.agreed`: a round one process skipped alone would
  leave the others in its collectives)."""
  poll = None
  if should_stop is not None and int(rounds_per_call) > 1 and jax.process_count() == 1:
    poll = StopPoll()
  got = _jit(algorithm, rounds_per_call, donate, check_state, max_abs, poll) if cache is None else cache.get(
    algorithm, rounds_per_call, donate, check_state, max_abs, poll)
  if poll is None:
    return got
  fn, held = got
  held.should_stop = should_stop
  return fn


# ------------------------------------------------------------------------ the loop
def _call_lengths(start: int, num_rounds: int, fuse: int, eval_every: int | None) -> int:
  """Rounds of the next call from round ``start``: ``fuse``, cut at the next evaluation
  round (a multiple of ``eval_every``) and at ``num_rounds``."""
  n = min(fuse, num_rounds - start)
  if eval_every:
    n = min(n, eval_every - start % eval_every)
  return n


def run(
  algorithm: FederatedAlgorithm,
  data: FederatedData,
  *,
  num_rounds: int,
  key: jax.Array,
  rounds_per_call: int = 1,
  state=None,
  on_metrics: Callable[[int, dict[str, float]], None] | None = None,
  on_rounds: Callable[[int, dict[str, np.ndarray]], None] | None = None,
  check_finite: bool = True,
  eval_every: int | None = None,
  on_eval: Callable[[Any, int], dict[str, float] | None] | None = None,
  on_call: Callable[[Any, int], None] | None = None,
  should_stop: Callable[[], bool] | None = None,
  label: str | None = None,
  cache: CompileCache | None = COMPILED,
  name_row: Callable[[int], str] | None = None,
  max_abs: float | None = DIVERGENCE_BOUND,
):
  """Runs rounds until ``state.round == num_rounds``; returns the final state.

  Args:
    algorithm: what to run.
    data: the federated data (device arrays).
    num_rounds: the round to stop at (a resumed ``state`` continues from its own round).
    key: the run's root key; round ``r`` uses ``fold_in(key, r)``.
    rounds_per_call: rounds fused into one compiled call.
    state: where to start (default ``algorithm.init(init_key(key))``).
    on_metrics: ``on_metrics(round, metrics)`` after every call with the last round's
      metrics as host floats (plus whatever ``on_eval`` returned at that round).
    on_rounds: ``on_rounds(first round, metrics)`` after every call (before ``on_metrics``) with
      every round's metrics of the call, host arrays ``[rounds of the call]`` (what is summed over
      rounds, e.g. bytes sent: :meth:`fedtree.toolbox.traffic.Traffic.add_rounds`).
    check_finite: stop with :class:`NonFiniteLossError` after a call in which the training
      loss or the state (client and server models, optimizer states) stopped being finite, or
      a state value passed ``max_abs`` (before ``on_call``: a diverged state is never
      checkpointed).
    eval_every: calls end at every multiple of this round (and at ``num_rounds``), where
      ``on_eval(state, round)`` is called; its dict joins the metrics.
    on_call: ``on_call(state, round)`` after every call and its checks (a checkpoint hook).
    should_stop: polled after every round (in one process; after every call over several):
      ``True`` ends the loop after the round in progress (a signal handler's flag), returning the
      state reached; a call of fused rounds then runs only its rounds up to there.
    label: names the run in errors (default ``algorithm.name``).
    cache: the compiled-function cache (``None``: compile afresh).
    name_row: names row ``e`` of every state leaf in divergence errors (a sweep's stacked state:
      its experiment ``e``, see :func:`describe_leaf`); its round may report
      ``nonfinite_experiment``, the first experiment whose round was not finite.
    max_abs: the divergence bound on ``|value|`` of every float state leaf (``None``: only
      non-finite values count as divergence).

  Example:
    HierFAVG on root -> 2 groups -> 5 clients, 4 rounds fused 2 per compiled call:

    >>> from fedtree.algorithms import hierfavg
    >>> from fedtree.core.data import as_device
    >>> data = as_device(data)
    >>> alg = hierfavg(model=model, topology=Topology.from_labels(groups), data=data,
    ...                local_optimizer=optax.sgd(0.1), schedule=LocalSchedule(batch_size=8, steps=2))
    >>> rows = []
    >>> state = run(alg, data, num_rounds=4, key=jax.random.key(0), rounds_per_call=2,
    ...             on_metrics=lambda r, m: rows.append(r))
    >>> int(state.round), rows, sorted(alg.models(state))
    (4, [2, 4], ['global', 'level1'])
  """
  if num_rounds < 0:
    raise ValueError(f"num_rounds={num_rounds} must be >= 0")
  if int(rounds_per_call) < 1:
    raise ValueError(f"rounds_per_call={rounds_per_call} must be >= 1")
  if eval_every is not None and int(eval_every) < 1:
    raise ValueError(f"eval_every={eval_every} must be >= 1")
  if max_abs is not None and not float(max_abs) > 0:
    raise ValueError(f"max_abs={max_abs!r} must be > 0, or None (no bound)")
  max_abs = None if max_abs is None else float(max_abs)
  label = label or algorithm.name
  state = algorithm.init(init_key(key)) if state is None else state
  paths = None
  done = int(state.round)
  while done < num_rounds:
    todo = _call_lengths(done, num_rounds, int(rounds_per_call), eval_every)
    step = compile_rounds(algorithm, todo, check_state=check_finite, cache=cache, max_abs=max_abs,
                          should_stop=should_stop)
    before = done
    state, metrics = step(state, data, key)
    done = int(state.round)
    todo, metrics = rounds_run(metrics, done - before)
    if check_finite:
      if paths is None:
        paths = [(p, name) for p, name, _ in _float_leaves(state)]
      check_metrics(metrics, done, label, paths, name_row, max_abs)
    after_call(state, metrics, done, todo, num_rounds, eval_every, on_rounds=on_rounds, on_metrics=on_metrics,
               on_eval=on_eval, on_call=on_call)
    if should_stop is not None and should_stop():
      break
  return state


def rounds_run(metrics: dict[str, Any], ran: int) -> tuple[int, dict[str, Any]]:
  """``(ran, metrics of those rounds)``: a call's metrics (stacked over its rounds) cut to the ``ran``
  rounds it ran (fewer than it holds where a stop request ended it inside, :func:`make_multi_round`)."""
  if all(int(np.shape(v)[0]) == ran for v in metrics.values()):
    return ran, metrics
  return ran, {k: v[:ran] for k, v in metrics.items()}


def after_call(state, metrics, done: int, todo: int, num_rounds: int, eval_every: int | None, *, on_rounds,
               on_metrics, on_eval, on_call) -> None:
  """The hooks of :func:`run` after a call of ``todo`` rounds that ended at round ``done`` (its checks
  passed), as a streamed run calls them too (:func:`fedtree.population.stream.run`)."""
  if on_rounds is not None:
    on_rounds(done - todo + 1, {k: np.asarray(v) for k, v in metrics.items() if k not in CHECK_KEYS})
  host = {k: np.asarray(v)[-1].item() for k, v in metrics.items() if k not in CHECK_KEYS}
  if on_eval is not None and (done == num_rounds or (eval_every and done % eval_every == 0)):
    host.update(on_eval(state, done) or {})
  if on_metrics is not None:
    on_metrics(done, host)
  if on_call is not None:
    on_call(state, done)


def check_metrics(metrics: dict[str, Any], done: int, label: str, paths: list[tuple[str, RowName]],
                  name_row: Callable[[int], str] | None = None, max_abs: float | None = None) -> None:
  """Raises :class:`NonFiniteLossError` for the first round of a call whose training loss or
  new state is not finite, or that reports a ``nonfinite_client`` (``metrics`` stacked over
  the call's rounds, ``done`` its last), naming the client, server node or state leaf (and,
  with ``name_row``, the sweep's experiment)."""
  n = len(np.asarray(next(iter(metrics.values()))))
  bad_rounds = np.zeros(n, bool)
  if "train_loss" in metrics:
    bad_rounds |= ~np.isfinite(np.asarray(metrics["train_loss"], np.float64))
  if "state_finite" in metrics:
    bad_rounds |= ~np.asarray(metrics["state_finite"])
  if "nonfinite_client" in metrics:
    bad_rounds |= np.asarray(metrics["nonfinite_client"]) >= 0
  if not bad_rounds.any():
    return
  i = int(np.argmax(bad_rounds))
  r = done - n + i + 1
  parts = []
  at = lambda k: int(np.asarray(metrics[k])[i]) if k in metrics else -1  # noqa: E731
  experiment, client = at("nonfinite_experiment"), at("nonfinite_client")
  if name_row is not None and experiment >= 0:
    parts.append(f"in {name_row(experiment)}")
  if client >= 0:
    parts.append(f"client {client} sent a non-finite update (its local training diverged, or its "
                 "data hold NaN or inf)")
  if "train_loss" in metrics and not np.isfinite(float(np.asarray(metrics["train_loss"])[i])):
    parts.append(f"training loss is {float(np.asarray(metrics['train_loss'])[i])}")
  if "state_finite" in metrics and not bool(np.asarray(metrics["state_finite"])[i]):
    leaf = int(np.asarray(metrics["bad_leaf"])[i])
    row = int(np.asarray(metrics["bad_row"])[i])
    where = describe_leaf(*paths[leaf], row, name_row) if 0 <= leaf < len(paths) else "the state"
    if "bad_finite" in metrics and bool(np.asarray(metrics["bad_finite"])[i]):
      parts.append(f"values beyond the divergence bound ±{max_abs:g} (config.divergence_bound) in "
                   f"{where}: the server state exploded")
    else:
      parts.append(f"non-finite values in {where}")
  raise NonFiniteLossError(
    f"run {label!r} diverged at round {r}: {'; '.join(parts)}; lower the learning rates "
    "(local or server) or check the data"
  )

