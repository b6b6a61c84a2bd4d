"""FFA-LoRA (Sun et al. 2024, "Improving LoRA in privacy-preserving federated learning") on any tree.

Every client's adapters share one ``A``, drawn once from ``seed`` and never trained; only ``B`` is
trained, sent, aggregated and counted in bytes (half the adapters' traffic at equal rank), and the
update path (clipping, noise, compression) acts on ``B`` alone. With ``A`` fixed the adapted kernel
``W + (α/r) A B`` is linear in what is aggregated, so the mean of the clients' ``B`` is the mean of
their updates: the paper's point, and why it suits differential privacy. ``A`` is a pure function of
``seed`` (the adapters' initializer, :func:`fedtree.toolbox.lora.init_adapters`), regenerated inside
every compiled round rather than stored or embedded; ``models()`` reports full adapters (``A`` and
``B``) so that evaluation scores them like any others.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedtree.algorithms.host import Host, hierfavg, method_over
from fedtree.core.algorithm import FederatedAlgorithm, NodeModels
from fedtree.core.model import Model
from fedtree.toolbox.lora import adapter_half, check_adapters, join_halves
from fedtree.toolbox.traffic import model_bytes


def frozen_a(model: Model, seed: int) -> Model:
  """``model`` (whose parameters are adapters) as a model of ``B`` alone, ``A`` the half of
  ``model.init(key(seed))``: ``init(key)`` the ``B`` of ``model.init(key)`` (zero), ``apply(b, x)``
  ``model.apply`` of both halves."""

  def a_of():
    return adapter_half(model.init(jax.random.key(seed)), "a")

  def init(key):
    return adapter_half(model.init(key), "b")

  def apply(b, x, **kw):
    return model.apply(join_halves(a_of(), b), x, **kw)

  return model._replace(init=init, apply=apply)


@method_over(hierfavg)
def ffa_lora(host: Host, *, seed: int = 0, name: str = "ffa_lora") -> FederatedAlgorithm:
  """FFA-LoRA on ``topology`` (default flat): see the module docstring.

  Args:
    seed: the draw of the frozen ``A`` (the same for every client and node).
    name: label for reports.
    **host: every other argument of :func:`~fedtree.algorithms.host.hierfavg.hierfavg`; ``model`` must be
      adapters on a frozen base (a run's ``adapters`` section), ``init_params`` full adapters (their
      ``B`` is the start; their ``A`` is replaced by the seed's).

  Raises:
    ValueError: a model whose parameters are not LoRA adapters.

  Example:
    >>> from fedtree.toolbox import lora
    >>> model = build_model("mlp", example_shape=data.example_shape, num_classes=3, hidden=(16,))
    >>> alg = lora.frozen_base(lambda m: ffa_lora(model=m, data=data, local_optimizer=optax.sgd(0.1),
    ...                                           schedule=LocalSchedule(batch_size=8, steps=2)),
    ...                        model=model, spec=lora.lora(rank=2), base=model.init(jax.random.key(0)))
    >>> state = loop.run(alg, data, num_rounds=1, key=jax.random.key(1))
    >>> lora.param_paths(state.inner.params[0])      # what the clients train and send
    ['Dense_0/kernel/b', 'Dense_1/kernel/b']
  """
  model = host["model"]
  check_adapters(jax.eval_shape(model.init, jax.random.key(0)), name)
  seed = int(seed)
  b_model = frozen_a(model, seed)
  init = host.get("init_params")
  b_init = None if init is None else adapter_half(init, "b")
  alg = host.replace(model=b_model, init_params=b_init).build(name=name)
  b_bytes = model_bytes(jax.eval_shape(b_model.init, jax.random.key(0)))

  def round_fn(state, data, key):   # a message is B (the host's sizes where it reports them: compressed)
    new, metrics = alg.round(state, data, key)
    return new, {"uplink_bytes": jnp.asarray(b_bytes, jnp.float32),
                 "downlink_bytes": jnp.asarray(b_bytes, jnp.float32), **metrics}

  def models(state):
    a = adapter_half(model.init(jax.random.key(seed)), "a")
    out = {}
    for key, node in alg.models(state).items():
      if isinstance(node, NodeModels):
        n = jax.tree.leaves(node.params)[0].shape[0]
        rows = jax.tree.map(lambda x, n=n: jnp.broadcast_to(x, (n, *x.shape)), a)
        node = node._replace(params=join_halves(rows, node.params))
      out[key] = node
    return out

  return alg._replace(round=round_fn, models=models)
