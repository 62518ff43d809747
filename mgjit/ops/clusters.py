"""Clusters: ClusterRank (this CTA's rank in its cluster) and ClusterSync (a barrier across every thread of
every CTA of the cluster, with release/acquire ordering).
"""
from __future__ import annotations

from typing import Any, Generator

import torch

from .. import dtypes, infer, interpret, lower
from ..errors import Loc
from ..interpret.scheduler import Wait, Warpgroup
from ..ir import Op, ScalarType


class ClusterRank(Op):
    name = "cluster_rank"
    requires = "cluster"

    def __init__(self, loc: Loc | None):
        super().__init__([], [ScalarType(dtypes.int32)], loc)


class ClusterSync(Op):
    """A barrier across every thread of every CTA in the cluster (release/acquire ordering)."""

    name = "cluster_sync"
    requires = "cluster"

    def __init__(self, loc: Loc | None):
        super().__init__([], [], loc)


infer.rule(ClusterRank, ClusterSync)(infer.no_arrays)


# ---------------------------------------------------------------------------------------------- lowering

def cluster_ctarank(ctx: lower.Context) -> Any:
    """%cluster_ctarank: the rank of this CTA in its cluster (i32)."""
    return ctx.e.asm("mov.u32 $0, %cluster_ctarank;", "=r", [], [ctx.e.int_type(32)])[0]


def pair_leader_rank(ctx: lower.Context) -> Any:
    """The cluster rank of this CTA pair's leader (the even one), for 2-CTA (collective) work."""
    return ctx.e.andi(cluster_ctarank(ctx), ctx.e.i32(~1))


@lower.rule(ClusterRank)
def _cluster_rank(op: ClusterRank, ctx: lower.Context) -> None:
    ctx.set(op.result, cluster_ctarank(ctx))


@lower.rule(ClusterSync)
def _cluster_sync(op: ClusterSync, ctx: lower.Context) -> None:
    ctx.e.asm_void("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;", "", [])


# ---------------------------------------------------------------------------------------------- interpreter

@interpret.rule(ClusterRank)
def _interp_cluster_rank(op: ClusterRank, wg: Warpgroup) -> None:
    wg.set(op.result, torch.tensor(wg.cta.rank, dtype=torch.int32))


@interpret.rule(ClusterSync)
def _interp_cluster_sync(op: ClusterSync, wg: Warpgroup) -> Generator[Wait, None, None]:
    yield wg.rendezvous(op, wg.cluster.sync)
