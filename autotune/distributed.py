"""Tuning under torch.distributed: ranks split the configs and share results, so that all pick one winner.

Every rank must tune the same keys in the same order (as in any SPMD program): each exchange is a
collective. Results are exchanged as JSON-able dicts; where two ranks hold a result for the same config
the lowest rank's wins, so that every rank merges to the same table and so to the same winner."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from .store import Result

T = TypeVar("T")


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) when torch.distributed is not in use."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def my_share(items: Sequence[T], rank: int, size: int) -> list[T]:
    """This rank's items, round-robin: rank r takes items r, r + size, r + 2*size, ..."""
    return list(items[rank::size])


def share(results: Mapping[str, Result], size: int) -> dict[str, Result]:
    """Every rank's `results` merged (lowest rank first wins); `results` itself when size is 1."""
    if size == 1:
        return dict(results)
    import torch.distributed as dist

    gathered: list[dict | None] = [None] * size
    dist.all_gather_object(gathered, {k: r.to_json() for k, r in results.items()})
    merged: dict[str, Result] = {}
    for rank_results in gathered:
        for config_key, data in (rank_results or {}).items():
            merged.setdefault(config_key, Result.from_json(data))
    return merged
