"""mgjit's ops, one module per op family. Each module holds its family's IR op classes with their verifiers,
and registers the family's layout-inference rules (`@infer.rule`), lowering rules (`@lower.rule`) and
interpreter rules (`@interpret.rule`) by op class. Importing this package registers every rule.

| module | ops |
| --- | --- |
| program | Constant, ProgramId, NumPrograms, RefDim |
| elementwise | Unary, Binary, Fma, Compare, Select, Cast |
| arrays | Splat, Iota, Broadcast, Relayout |
| reductions | Reduce |
| control | For, If, Yield |
| gmem | Load, Store |
| smem | SmemAlloc, RefIndex, RefTranspose, SmemStore, SmemLoad |
| barriers | BarrierAlloc, BarrierArrive, BarrierWait, FenceAsyncShared |
| tma | TmaLoad, TmaLoadCollective, TmaStore, TmaStoreWait |
| wgmma | Wgmma, WgmmaWait |
| warpgroups | WarpgroupId, SetMaxRegisters |
| clusters | ClusterRank, ClusterSync |
| tmem | TmemAlloc, TmemSlice, TmemLoad, TmemStore, TmemDealloc |
| tcgen05 | Tcgen05Mma, Tcgen05Commit |
"""
from .arrays import Broadcast, Iota, Relayout, Splat
from .barriers import BarrierAlloc, BarrierArrive, BarrierWait, FenceAsyncShared
from .clusters import ClusterRank, ClusterSync
from .control import For, If, Yield
from .elementwise import Binary, Cast, Compare, Fma, Select, Unary
from .gmem import Load, Store
from .program import Constant, NumPrograms, ProgramId, RefDim
from .reductions import Reduce
from .smem import RefIndex, RefTranspose, SmemAlloc, SmemLoad, SmemStore
from .tcgen05 import Tcgen05Commit, Tcgen05Mma
from .tma import TmaLoad, TmaLoadCollective, TmaStore, TmaStoreWait
from .tmem import TmemAlloc, TmemDealloc, TmemLoad, TmemSlice, TmemStore, tmem_layout
from .warpgroups import SetMaxRegisters, WarpgroupId
from .wgmma import Wgmma, WgmmaWait

__all__ = ["BarrierAlloc", "BarrierArrive", "BarrierWait", "Binary", "Broadcast", "Cast", "ClusterRank",
           "ClusterSync", "Compare", "Constant", "FenceAsyncShared", "Fma", "For", "If", "Iota", "Load", "NumPrograms",
           "ProgramId", "Reduce", "RefDim", "RefIndex", "RefTranspose", "Relayout", "Select", "SetMaxRegisters",
           "SmemAlloc", "SmemLoad", "SmemStore", "Splat", "Store", "Tcgen05Commit", "Tcgen05Mma", "TmaLoad", "TmaLoadCollective",
           "TmaStore", "TmaStoreWait", "TmemAlloc", "TmemDealloc", "TmemLoad", "TmemSlice", "TmemStore", "Unary",
           "WarpgroupId", "Wgmma", "WgmmaWait", "Yield", "tmem_layout"]
