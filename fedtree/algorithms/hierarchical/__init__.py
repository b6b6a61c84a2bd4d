"""Methods built on the tree itself: B-HFL (paper 001), pFedMT (paper 003) and GroupPerFL (paper
000); HierFAVG is the host (:func:`~fedtree.algorithms.host.hierfavg.hierfavg`)."""

from fedtree.algorithms.hierarchical.bhfl import bhfl
from fedtree.algorithms.hierarchical.grouppfl import grouppfl
from fedtree.algorithms.hierarchical.pfedmt import pfedmt

__all__ = ["bhfl", "grouppfl", "pfedmt"]
