"""FedAsync (Xie, Koyejo and Gupta 2019, "Asynchronous federated optimization") on the simulated
clock of :mod:`fedtree.toolbox.systems`: a thin spec over
:func:`~fedtree.algorithms.asynchronous.fedbuff.fedbuff`.

``concurrency`` clients train at once, each from the model version ``x_τ`` it downloaded when it
started (locally minimising ``f(x) + (ρ/2)‖x − x_τ‖²`` with ``rho``, plain SGD without); the server
applies **one client's model at a time**, as it arrives, mixing it into the current model with a
staleness-weighted rate:

  ``x_t = (1 − α_t) x_{t−1} + α_t x_new``,  ``α_t = α · s(t − τ)``,

and the freed slot starts a new client from ``x_t``. ``s`` is one of the paper's staleness functions
(``staleness``: ``"polynomial"`` ``(t − τ + 1)^-a`` by default, ``"constant"``, ``"hinge"``;
:func:`~fedtree.algorithms.asynchronous.fedbuff.staleness_factor`).

This is FedBuff's machinery with a buffer of one: its in-flight slots, its ring of the last
``max_staleness + 1`` model versions, its simulated clock, partial work, dropouts and deadlines and
its upper levels. The two differ in what an update is taken against: FedBuff steps by the client's
own change ``x_τ − y`` (``update_from="start"``), FedAsync mixes the client's model into the
current one, a step of ``α s (x_{t−1} − y)`` (``update_from="current"``, with ``sgd(α)`` as the
server optimizer). What a client sends is the same (its change from ``x_τ``, or its model: the same
bytes), so the update path (clipping, compression) sees it as sent and the server adds the
``x_{t−1} − x_τ`` it knows. With one client in flight (``concurrency=1``, the default) nothing is
ever stale and, with ``α = 1`` and one local step, FedAsync is sequential SGD over the clients on
the server's model (tested).

**Simultaneous arrivals** (``simultaneous``; on a clock without ``systems`` every client with the
same step count finishes at the same second): ``"queue"`` (default; the paper's one update at a
time: the others are applied in the following server updates, ties broken by slot, each a version
staler), ``"together"`` (FLGo: everything that arrived at the same moment is mixed in one step,
``x ← mean_k[(1 − α_k) x + α_k y_k]``, by the host's ``weighting``; FLGo weights by data size:
``weighting="examples"``) or ``"drop"`` (FedLab's standalone simulation keeps the first and discards
the others; ``clients_discarded``).

**Other implementations.** FLGo's hinge is ``1 / (a (t − τ − b))`` (without the paper's ``+ 1``:
twice as large a step one version past ``b`` with ``a = 1``, and a division by zero for ``a (t − τ
− b) = 0``); FedLab's polynomial function in some versions returns ``(t − τ + 1)^-a`` without the
factor ``α``. Both follow the paper here. FLGo's FedAsync also samples new clients only every
``period`` ticks of its clock; here a freed slot starts a new client at once (FedBuff's
concurrency). ``staleness_exponent`` (``a``: 0.5, FLGo's ``poly_a``), ``hinge_a``/``hinge_b``
(10 and 4, FedLab's) and ``alpha`` (0.6, FLGo's and FedLab's) default to those implementations'.

**On a tree** every parent of clients runs FedAsync on its own clients, slots, ring and clock; the
levels above aggregate as HierFAVG every ``periods[l]`` rounds (one round is one server update at
every parent), as FedBuff's do. **Composition**: client transforms of the update path (clipping,
local noise, compression) at the clients' tier, systems (its clock is FedBuff's), any stateless local
objective; a robust aggregator, node or downlink transforms are refused as FedBuff refuses them
(updates are applied as they arrive). Bytes: a client receives one model and sends one.
"""

from __future__ import annotations

import optax

from fedtree.algorithms.asynchronous.fedbuff import fedbuff
from fedtree.algorithms.host import Host, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_nonnegative, is_traced, named
from fedtree.core.topology import Topology
from fedtree.objectives.fedprox import fedprox_update


@method_over(fedbuff, drops=("buffer_size", "server_optimizer", "update_from"), bound=())
def fedasync(
  host: Host,
  *,
  alpha: float = 0.6,
  rho: float | None = None,
  max_staleness: int = 16,
  name: str = "fedasync",
) -> FederatedAlgorithm:
  """FedAsync at the clients' parents of ``topology`` (default flat): see the module docstring.

  Args:
    alpha: ``α`` in (0, 1], the mixing rate (the server optimizer is ``sgd(α)``; the levels above
      take ``sgd(1)``, HierFAVG's average).
    rho: ``ρ >= 0``, the weight of the local proximal term ``(ρ/2)‖x − x_τ‖²`` (FedProx's local
      objective; ``None``: plain local SGD). Not with ``client_update``.
    max_staleness: the oldest version a client may have started from and still be applied (the
      ring holds ``max_staleness + 1`` models per parent; staler updates are dropped,
      ``clients_stale``).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.asynchronous.fedbuff.fedbuff`: ``concurrency``
      (clients in flight per parent, default 1), ``staleness``, ``staleness_exponent``,
      ``hinge_a``, ``hinge_b``, ``simultaneous``, ``systems``, ``topology``, ``periods``, ...

  Raises:
    ValueError: ``alpha`` outside (0, 1], ``rho < 0``, ``rho`` with a ``client_update``, and
      FedBuff's refusals (named ``fedasync``).

  Example:
    Four server updates with 3 of 5 clients in flight on devices of different speeds:

    >>> import jax, numpy as np, optax
    >>> from fedtree.core import loop
    >>> from fedtree.core.local import LocalSchedule
    >>> from fedtree.toolbox.systems import Systems, make_profile
    >>> from fedtree.datasets.synthetic import grouped_synthetic
    >>> from fedtree.models import build_model
    >>> data, _ = grouped_synthetic(group_sizes=(3, 2), dim=8, num_classes=3)
    >>> model = build_model("logreg", example_shape=data.example_shape, num_classes=3)
    >>> devices = Systems(profile=make_profile([1.0, 2.0, 4.0, 0.5, 8.0], np.full(5, 1e6)))
    >>> alg = fedasync(model=model, data=data, local_optimizer=optax.sgd(0.1),
    ...                schedule=LocalSchedule(batch_size=8, steps=2), concurrency=3, systems=devices)
    >>> rows = []
    >>> state = loop.run(alg, data, num_rounds=4, key=jax.random.key(0),
    ...                  on_metrics=lambda r, m: rows.append(m))
    >>> [int(m["clients_trained"]) for m in rows]    # one client's model a server update
    [1, 1, 1, 1]
  """
  with named(name):
    if not is_traced(alpha) and not 0 < float(alpha) <= 1:
      raise ValueError(f"alpha={alpha!r} must be in (0, 1]")
    if rho is not None:
      check_nonnegative(rho=rho)
  if rho is not None and host.get("client_update") is not None:
    raise ValueError(f"{name}: rho={rho!r} sets FedAsync's local objective (f + (ρ/2)‖x − x_τ‖²); give it or "
                     f"a client_update, not both")
  if rho is not None:
    def proximal(s: LocalSetup):
      return fedprox_update(s.model, s.optimizer, mu=rho, batch_size=s.batch_size, max_steps=s.max_steps,
                            compute_dtype=s.compute_dtype)

    host = host.replace(client_update=proximal)
  topology = host.get("topology") or Topology.flat(host["data"].num_clients)
  servers = (optax.sgd(1.0),) * (topology.depth - 1) + (optax.sgd(alpha),)
  return host.build(buffer_size=1, server_optimizer=servers, update_from="current",
                    max_staleness=max_staleness, name=name)
