"""Clusters: `mgjit.cluster_rank()`, `mgjit.cluster_sync()`, `mgjit.cluster_reduce(x, kind)` and
`mgjit.cluster_gather(x, ...)`."""
from __future__ import annotations

from ... import ir, language as lang, ops
from ..registry import builtin
from ..semantics import Semantics
from ..values import Tensor


EXCHANGES = "$exchanges"  # the hidden count of the exchanges between CTAs run so far (ops/clusters.py says why)


def exchange_count(t: Semantics, ctas: int) -> ir.Value | None:
    """The count of exchanges between the CTAs of the cluster run before this one (None within one CTA), counted
    up for the next. The trace starts it at 0 in every kernel compiled for a cluster."""
    if ctas == 1:
        return None
    count = t.scope[EXCHANGES]
    t.scope[EXCHANGES] = t.binary("add", count, 1)
    return count.value


@builtin(lang.cluster_rank, unit="cluster")
def cluster_rank(t: Semantics, args: list, kwargs: dict) -> Tensor:
    return t.emit(ops.ClusterRank(t.builder.loc))


@builtin(lang.cluster_sync, unit="cluster")
def cluster_sync(t: Semantics, args: list, kwargs: dict) -> None:
    t.builder.add(ops.ClusterSync(t.builder.loc))


@builtin(lang.cluster_reduce, unit="cluster", positional=(0, 2))
def cluster_reduce(t: Semantics, args: list, kwargs: dict) -> Tensor:
    x = args[0] if args else kwargs.get("x")
    kind = args[1] if len(args) > 1 else kwargs.get("kind")
    if kind not in lang.REDUCE_BUILTINS.values():
        raise t.error(f"cluster_reduce(x, kind): kind is one of {sorted(lang.REDUCE_BUILTINS.values())}, got {kind!r}")
    x = t.to_tensor(x)
    ctas = t.cluster[0] * t.cluster[1] * t.cluster[2]
    return t.emit(ops.ClusterReduce(kind, x.value, ctas, t.builder.loc, exchange_count(t, ctas)))


@builtin(lang.cluster_gather, unit="cluster")
def cluster_gather(t: Semantics, args: list, kwargs: dict) -> tuple:
    if kwargs or not args:
        raise t.error("cluster_gather(x, ...) takes one or more values, positionally")
    values = [t.to_tensor(x) for x in args]
    ctas = t.cluster[0] * t.cluster[1] * t.cluster[2]
    op = ops.ClusterGather([x.value for x in values], ctas, t.num_warpgroups, t.builder.loc, exchange_count(t, ctas))
    t.builder.add(op)
    slots = op.slots
    gathered = tuple(tuple(Tensor(t, r) for r in op.results[i * slots:(i + 1) * slots]) for i in range(len(values)))
    return gathered[0] if len(values) == 1 else gathered
