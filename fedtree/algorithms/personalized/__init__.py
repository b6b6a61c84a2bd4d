"""Personalized FL, every client its own model: by regularization (Ditto, pFedMe, Per-FedAvg), by
mixtures (APFL, FedALA, FedEM, kNN-Per) and by learning from peers (FedAMP, FedFomo, pFedHN,
FedProto)."""

from fedtree.algorithms.personalized.apfl import apfl
from fedtree.algorithms.personalized.ditto import ditto
from fedtree.algorithms.personalized.fedala import fedala
from fedtree.algorithms.personalized.fedamp import fedamp
from fedtree.algorithms.personalized.fedem import fedem
from fedtree.algorithms.personalized.fedfomo import fedfomo
from fedtree.algorithms.personalized.fedproto import fedproto
from fedtree.algorithms.personalized.knnper import knnper
from fedtree.algorithms.personalized.perfedavg import perfedavg
from fedtree.algorithms.personalized.pfedhn import pfedhn
from fedtree.algorithms.personalized.pfedme import pfedme

__all__ = ["apfl", "ditto", "fedala", "fedamp", "fedem", "fedfomo", "fedproto", "knnper", "perfedavg",
           "pfedhn", "pfedme"]
