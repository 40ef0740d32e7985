"""The communication-operator graph (COG): operators linked to communicator groups, per-rank
execution order, cross-rank matching of the same operator. See :mod:`holmes.cog.graph`."""

from holmes.cog.graph import OP_CODES, CommOpGraph, RankOps

__all__ = ["CommOpGraph", "RankOps", "OP_CODES"]
