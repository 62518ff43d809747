"""The kernel language's builtins, one module per hardware unit, each registering its builtins (and the
methods of the values they make) in `registry` beside their semantic checks. Importing this package registers
them all."""
from . import (atomics, barriers, clc, clusters, core, debug, gmem, pipeline, smem, tcgen05, tma,  # noqa: F401
               warpgroups, wgmma)
