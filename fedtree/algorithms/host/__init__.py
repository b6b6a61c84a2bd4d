"""The host every method of the hierarchical-FedAvg family runs on: a validated plan and a round in
named phases (:mod:`~fedtree.algorithms.host.hierfavg`), and how a method declares itself a thin spec
over it (:func:`~fedtree.algorithms.host.hierfavg.hierfavg_method`)."""

from fedtree.algorithms.host.hierfavg import hierfavg, hierfavg_method, on_host

__all__ = ["hierfavg", "hierfavg_method", "on_host"]
