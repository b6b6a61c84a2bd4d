"""FedAsync (Xie, Koyejo and Gupta 2019): one client's model mixed in at a time with a
staleness-weighted rate, a thin spec over FedBuff.

The equations, simultaneous arrivals and how FLGo and FedLab differ: :doc:`FedAsync on the
asynchronous page <algorithms/asynchronous.md#fedasync>`.

References:
  Xie, Koyejo and Gupta, Asynchronous federated optimization, 2019.
"""

from __future__ import annotations

import optax

from fedtree.algorithms.asynchronous.fedbuff import fedbuff
from fedtree.algorithms.host import Host, cannot, method_over
from fedtree.core.algorithm import FederatedAlgorithm, LocalSetup
from fedtree.core.checks import check_nonnegative, is_traced, named
from fedtree.core.topology import Topology
from fedtree.objectives.fedprox import fedprox_update


@method_over(fedbuff, drops=("buffer_size", "server_optimizer", "update_from"), bound=(), cannot=(
  cannot("blockwise", "each server step applies one client's update alone (a buffer of one), so a "
                      "robust aggregator has no cohort to compare; FedAsync bounds a stale update by "
                      "s(t - τ) instead (Xie et al. 2019, Sec. 5)"),
  cannot("node_transform", "each server step applies one client's update alone, and which client's "
                           "depends on the devices' simulated speeds, not on a uniform draw the accountant "
                           "could amplify by; privatize at the clients (privacy.mechanism='local')"),
))
def fedasync(
  host: Host,
  *,
  alpha: float = 0.6,
  rho: float | None = None,
  max_staleness: int = 16,
  name: str = "fedasync",
) -> FederatedAlgorithm:
  """FedAsync at the clients' parents of ``topology`` (default flat): every arriving client's model
  mixed into the current one, ``x ← (1 − α s(t − τ)) x + α s(t − τ) x_new`` (:doc:`the method's page
  <algorithms/asynchronous.md#fedasync>`).

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

    >>> from fedtree.toolbox.systems import Systems, make_profile
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
