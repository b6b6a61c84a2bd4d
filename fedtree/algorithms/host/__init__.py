"""The host every method of the hierarchical-FedAvg family runs on: a validated plan
(:mod:`~fedtree.algorithms.host.plan`) and a round in named phases
(:mod:`~fedtree.algorithms.host.phases`) that other hosts reuse; a method is a thin spec over a
host (:func:`~fedtree.algorithms.host.method.method_over`) that declares what it cannot compose with
(:func:`~fedtree.algorithms.host.refusals.cannot`)."""

from fedtree.algorithms.host.hierfavg import hierfavg
from fedtree.algorithms.host.method import Host, method_over
from fedtree.algorithms.host.refusals import COMPOSITIONS, Refusal, cannot

__all__ = ["COMPOSITIONS", "Host", "Refusal", "cannot", "hierfavg", "method_over"]
