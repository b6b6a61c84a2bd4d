"""Methods that change how one global model is optimized: FedAvg/FedOpt, FedProx, SCAFFOLD, FedDyn,
FedNova, Mime/MimeLite, MOON, q-FFL, AFL, FedMMD, FedKWS-UI (paper 002), FFA-LoRA (one global set of
LoRA ``B`` matrices over a frozen ``A``), and FedEx (the local learning rate tuned while the model
trains). Comparisons with the peers' implementations: ``docs/algorithms/optimization.md``."""

from fedtree.algorithms.optimization.afl import afl
from fedtree.algorithms.optimization.fedavg import fedavg
from fedtree.algorithms.optimization.feddyn import feddyn
from fedtree.algorithms.optimization.fedex import fedex
from fedtree.algorithms.optimization.fedkws import fedkws
from fedtree.algorithms.optimization.fedmmd import fedmmd
from fedtree.algorithms.optimization.fednova import fednova
from fedtree.algorithms.optimization.fedprox import fedprox
from fedtree.algorithms.optimization.ffa_lora import ffa_lora
from fedtree.algorithms.optimization.mime import mime, mimelite
from fedtree.algorithms.optimization.moon import moon
from fedtree.algorithms.optimization.qffl import qffl
from fedtree.algorithms.optimization.scaffold import scaffold

__all__ = ["afl", "fedavg", "feddyn", "fedex", "ffa_lora", "fedkws", "fedmmd", "fednova", "fedprox", "mime",
           "mimelite", "moon", "qffl", "scaffold"]
