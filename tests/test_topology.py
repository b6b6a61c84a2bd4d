"""fedtree.core.topology: the tree builders agree, and bad labels are refused by name."""

import numpy as np
import pytest

from fedtree.core.topology import Topology


def test_topology_builders_agree():
  a = Topology.from_sizes([[2, 1], [3]])
  b = Topology.from_label_columns([[0, 0, 0, 1, 1, 1], [0, 0, 1, 2, 2, 2]])
  assert a == b and hash(a) == hash(b)
  assert a.depth == 3 and [a.num_nodes(lv) for lv in range(4)] == [1, 2, 3, 6]
  np.testing.assert_array_equal(a.ancestor(1), [0, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(a.leaf_counts(2), [2, 1, 3])
  np.testing.assert_array_equal(a.num_children(1), [2, 1])
  assert Topology.flat(4).depth == 1


@pytest.mark.parametrize("labels,match", [
  ([0, 2, 2], r"label\(s\) \[1\] have no clients"),
  ([0, -1], "negative label"),
  ([0.5, 1], "must hold integers"),
  ([], "empty"),
])
def test_topology_bad_labels(labels, match):
  with pytest.raises(ValueError, match=match):
    Topology.from_labels(labels)


def test_topology_columns_must_nest_and_agree():
  with pytest.raises(ValueError, match="spans two parents"):
    Topology.from_label_columns([[0, 0, 1], [0, 1, 1]])
  with pytest.raises(ValueError, match="disagree in length"):
    Topology.from_label_columns([[0, 0, 1], [0, 1]])
  with pytest.raises(ValueError, match="same depth|different depths"):
    Topology.from_sizes([[2, 2], 3])
  with pytest.raises(ValueError, match="no children"):
    Topology(parents=((0, 0), (0, 0)))
