"""The toolbox: the capabilities' in-jit halves, a floor above the engine (:mod:`fedtree.core`).

Each module is what one capability contributes to a round, built by factories in the optax style
and handed to the engine through the update path's seam (:mod:`fedtree.core.updates`); the
experiment layer declares each capability's run section, host half and table of names
(:mod:`fedtree.experiment.capabilities`).

* :mod:`~fedtree.toolbox.privacy`: clipping and Gaussian noise (central, local, per level),
  adaptive clipping; :mod:`~fedtree.toolbox.accountant`: the privacy spent (ε) and the noise that
  reaches a target.
* :mod:`~fedtree.toolbox.robust`: robust aggregators (median, trimmed mean, Krum, Bulyan, ...);
  :mod:`~fedtree.toolbox.attacks`: Byzantine clients and what they send.
* :mod:`~fedtree.toolbox.compression`: lossy encodings of what travels along an edge, with their
  sizes; :mod:`~fedtree.toolbox.traffic`: the bytes a run sends on every edge.
* :mod:`~fedtree.toolbox.secagg`: secure aggregation (a ``b``-bit field, encodings, the modular sum,
  dropout recovery, the protocol's bytes); :mod:`~fedtree.toolbox.distributed_dp`: the distributed
  discrete Gaussian and Skellam mechanisms and their accounting; :mod:`~fedtree.toolbox.discrete_noise`:
  their integer samplers.
* :mod:`~fedtree.toolbox.systems`: devices, availability, deadlines and a simulated clock.
* :mod:`~fedtree.toolbox.lora`: low-rank adapters on a frozen, shared base model.

Submodules are imported explicitly (``from fedtree.toolbox import robust``); this package
imports nothing on its own.
"""
