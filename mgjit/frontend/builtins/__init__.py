"""The kernel language's builtins, one module per hardware unit, each registering its builtins (and the
methods of the values they make) in `registry` beside their semantic checks. Importing this package registers
them all."""
from . import atomics, barriers, clusters, core, gmem, pipeline, smem, tcgen05, tma, warpgroups, wgmma  # noqa: F401
