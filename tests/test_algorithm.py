"""fedtree.core.algorithm: the default local training and its refusals."""

import numpy as np
import pytest

from fedtree.core.data import FederatedData
from fedtree.core.local import LocalSchedule
from fedtree.models import build_model


def test_local_training_defaults_to_sgd_and_refuses_state_where_asked():
  import optax

  from fedtree.core.algorithm import local_training
  from fedtree.core.local import ClientUpdate

  data = FederatedData(
    x_train=np.zeros((2, 5, 3), np.float32), y_train=np.zeros((2, 5), np.int32),
    n_train=np.asarray([5, 3], np.int32), x_test=np.zeros((2, 1, 3), np.float32),
    y_test=np.zeros((2, 1), np.int32), n_test=np.ones(2, np.int32), num_classes=2,
  )
  model = build_model("logreg", example_shape=(3,), num_classes=2)
  update = local_training(None, model, optax.sgd(0.1), LocalSchedule(batch_size=2), data)
  assert update.init_state is None
  stateful = ClientUpdate(apply=update.apply, init_state=lambda params, n: ())
  assert local_training(stateful, model, optax.sgd(0.1), LocalSchedule(batch_size=2), data) is stateful
  with pytest.raises(ValueError, match="ifca: the client update must be stateless"):
    local_training(stateful, model, optax.sgd(0.1), LocalSchedule(batch_size=2), data,
                   stateless_for="ifca")
