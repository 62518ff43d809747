"""Clusters: `mgjit.cluster_rank()` and `mgjit.cluster_sync()`."""
from __future__ import annotations

from ... import language as lang, ops
from ..registry import builtin
from ..semantics import Semantics
from ..values import Tensor


@builtin(lang.cluster_rank, unit="cluster")
def cluster_rank(t: Semantics, args: list, kwargs: dict) -> Tensor:
    return t.emit(ops.ClusterRank(t.builder.loc))


@builtin(lang.cluster_sync, unit="cluster")
def cluster_sync(t: Semantics, args: list, kwargs: dict) -> None:
    t.builder.add(ops.ClusterSync(t.builder.loc))
