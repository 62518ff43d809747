"""`Config`: one point of a tuning sweep, and `expand_space`, which turns a search space into configs."""
from __future__ import annotations

import itertools
import json
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

# The two launch options a config may set beside the kernel's constexpr parameters.
LAUNCH_OPTIONS = ("num_warpgroups", "cluster")

# Values a config may hold: they must survive a round trip through JSON (the on-disk store keys on them)
# and hash, so tuples of these are allowed and lists are turned into tuples.
_SCALARS = (bool, int, float, str, type(None))


def _freeze(name: str, value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, _SCALARS) for v in value):
        return tuple(value)
    raise TypeError(
        f"Config value of {name!r} must be a bool, int, float, str, None or a tuple of those "
        f"(it is stored as JSON); got {value!r} of type {type(value).__name__}"
    )


def _cluster(value: Any) -> tuple[int, int, int] | None:
    if value is None:
        return None
    dims = (value,) if isinstance(value, int) else tuple(value) if isinstance(value, (tuple, list)) else None
    if dims is None or not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and not isinstance(d, bool)
                                                          and d >= 1 for d in dims):
        raise ValueError(f"Config cluster must be 1 to 3 positive ints, e.g. (2, 1, 1); got {value!r}")
    dims += (1,) * (3 - len(dims))
    # No cluster and a 1x1x1 cluster launch alike; one spelling keeps them one config.
    return None if dims == (1, 1, 1) else dims


class Config:
    """Constexpr values plus launch options for one candidate: `Config(BM=128, BN=256, num_warpgroups=3)`.

    A launch option left as None is not passed, so the kernel's own default applies (`@mgjit.kernel(
    num_warpgroups=2)`; no cluster). Immutable and hashable; two configs with the same values are equal
    whatever order the values were given in. `key()` is the canonical JSON text that the on-disk store
    keys on."""

    __slots__ = ("kwargs", "num_warpgroups", "cluster", "_key")

    kwargs: Mapping[str, Any]
    num_warpgroups: int | None
    cluster: tuple[int, int, int] | None

    def __init__(self, num_warpgroups: int | None = None, cluster: Any = None, **kwargs: Any):
        if num_warpgroups is not None and (not isinstance(num_warpgroups, int) or isinstance(num_warpgroups, bool)
                                           or num_warpgroups < 1):
            raise ValueError(f"Config num_warpgroups must be a positive int or None; got {num_warpgroups!r}")
        frozen = {name: _freeze(name, value) for name, value in kwargs.items()}
        cluster = _cluster(cluster)
        key = json.dumps({"kwargs": frozen, "num_warpgroups": num_warpgroups, "cluster": cluster},
                         sort_keys=True, separators=(",", ":"))
        for name, value in (("kwargs", types.MappingProxyType(frozen)), ("num_warpgroups", num_warpgroups),
                            ("cluster", cluster), ("_key", key)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Config is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Config is immutable; cannot delete {name!r}")

    def __reduce__(self) -> tuple:
        # The read-only kwargs view does not pickle; rebuild through the constructor instead.
        return (_rebuild, (dict(self.kwargs), self.num_warpgroups, self.cluster))

    def key(self) -> str:
        """Canonical JSON text: equal configs give equal keys in any process."""
        return self._key

    def to_json(self) -> dict[str, Any]:
        return json.loads(self._key)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Config:
        if not isinstance(data, Mapping) or not isinstance(data.get("kwargs"), Mapping):
            raise ValueError(f"expected a config's JSON form {{'kwargs': {{...}}, 'num_warpgroups': n, "
                             f"'cluster': [x, y, z]}}; got {data!r}")
        return cls(num_warpgroups=data.get("num_warpgroups"), cluster=data.get("cluster"), **data["kwargs"])

    def replace(self, **changes: Any) -> Config:
        """This config with `changes` set: constexprs by name (new ones added), or the launch options
        `num_warpgroups` and `cluster`."""
        options = {"num_warpgroups": self.num_warpgroups, "cluster": self.cluster}
        options.update((k, changes.pop(k)) for k in list(changes) if k in options)
        return Config(**options, **{**self.kwargs, **changes})

    def launch_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `Kernel.compile` and a launch: the constexprs plus the launch options set."""
        options = {**self.kwargs}
        if self.num_warpgroups is not None:
            options["num_warpgroups"] = self.num_warpgroups
        if self.cluster is not None:
            options["cluster"] = self.cluster
        return options

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        parts = [f"{k}={v!r}" for k, v in self.kwargs.items()]
        if self.num_warpgroups is not None:
            parts.append(f"num_warpgroups={self.num_warpgroups}")
        if self.cluster is not None:
            parts.append(f"cluster={self.cluster}")
        return f"Config({', '.join(parts)})"

    def short(self) -> str:
        """A compact one-line form for tables and plots: `BM=128 BN=256 wg=3 cl=2x1x1`."""
        parts = [f"{k}={v}" for k, v in self.kwargs.items()]
        if self.num_warpgroups is not None:
            parts.append(f"wg={self.num_warpgroups}")
        if self.cluster is not None:
            parts.append("cl=" + "x".join(map(str, self.cluster)))
        return " ".join(parts)


def _rebuild(kwargs: dict[str, Any], num_warpgroups: int | None, cluster: tuple[int, int, int] | None) -> Config:
    return Config(num_warpgroups=num_warpgroups, cluster=cluster, **kwargs)


def expand_space(space: Mapping[str, Iterable[Any]],
                 space_filter: Callable[[Config], bool] | None = None) -> list[Config]:
    """The cartesian product of `space` (name -> candidate values), in the order given, as configs.

    `num_warpgroups` and `cluster` entries become launch options; `space_filter(config)` keeps a config
    when it returns true."""
    if not isinstance(space, Mapping) or not space:
        raise ValueError(f"space must be a non-empty dict of name -> list of values; got {space!r}")
    names = list(space)
    choices = []
    for name in names:
        values = space[name]
        if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
            raise TypeError(f"space[{name!r}] must be a list of candidate values; got {values!r}")
        values = list(values)
        if not values:
            raise ValueError(f"space[{name!r}] is empty: a search space needs at least one value per name")
        choices.append(values)
    configs = [Config(**dict(zip(names, combo, strict=True))) for combo in itertools.product(*choices)]
    if space_filter is not None:
        configs = [c for c in configs if space_filter(c)]
    if not configs:
        raise ValueError("space_filter removed every config of the search space")
    return configs
