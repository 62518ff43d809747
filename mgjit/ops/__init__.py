"""mgjit's ops, one module per op family. Each module holds its family's IR op classes with their verifiers,
and registers the family's layout-inference rules (`@infer.rule`), lowering rules (`@lower.rule`) and
interpreter rules (`@interpret.rule`) by op class. Importing this package registers every rule.

| module | ops |
| --- | --- |
| program | Constant, ProgramId, NumPrograms, RefDim |
| elementwise | Unary, Binary, Fma, Compare, Select, Cast |
| arrays | Splat, Iota, Broadcast, ArraySlice, Relayout |
| reductions | Reduce, ReduceAll, Squeeze |
| control | For, If, Yield |
| gmem | Load, Store |
| gmem_gather | Gather |
| atomics | Atomic, SemaphoreWait |
| smem | SmemAlloc, SmemStore, SmemLoad |
| smem_views | RefIndex, RefSlice, RefTranspose, RefWindow |
| smem_scopes | ScopedSmemAlloc, SmemFree |
| barriers | BarrierAlloc, BarrierArrive, BarrierArriveCluster, BarrierWait, FenceAsyncShared |
| tma | TmaLoad, TmaLoadCollective, TmaStore, TmaStoreWait, TmaPrefetch, TmaDescriptorCut |
| tma_gather | TmaGather |
| wgmma | Wgmma, WgmmaWait |
| warpgroups | WarpgroupId, SetMaxRegisters, CtaSync, NamedBarrierAlloc, NamedBarrierArrive, NamedBarrierSync |
| warps | WarpSplit |
| clusters | ClusterRank, ClusterSync, ClusterReduce, ClusterGather |
| clc | ClcTryCancel, ClcQuery (cluster launch control) |
| tmem | TmemAlloc, TmemIndex, TmemSlice, TmemLoad, TmemStore, TmemDealloc |
| tcgen05 | Tcgen05Mma, Tcgen05Copy, Tcgen05Commit |
| debug | Print, ProfileStart, ProfileEvent, DeviceAssert |
"""
from .arrays import ArraySlice, Broadcast, Iota, Relayout, Splat
from .atomics import Atomic, SemaphoreWait
from .barriers import BarrierAlloc, BarrierArrive, BarrierArriveCluster, BarrierWait, FenceAsyncShared
from .clc import ClcQuery, ClcTryCancel
from .clusters import ClusterGather, ClusterRank, ClusterReduce, ClusterSync
from .control import For, If, Yield
from .debug import DeviceAssert, Print, ProfileEvent, ProfileStart
from .elementwise import Binary, Cast, Compare, Fma, Select, Unary
from .gmem import Load, Store
from .gmem_gather import Gather
from .program import Constant, NumPrograms, ProgramId, RefDim
from .reductions import Reduce, ReduceAll, Squeeze
from .smem import SmemAlloc, SmemLoad, SmemStore
from .smem_scopes import ScopedSmemAlloc, SmemFree
from .smem_views import RefIndex, RefSlice, RefTranspose, RefWindow
from .tcgen05 import Tcgen05Commit, Tcgen05Copy, Tcgen05Mma
from .tma import TmaDescriptorCut, TmaLoad, TmaLoadCollective, TmaPrefetch, TmaStore, TmaStoreWait
from .tma_gather import TmaGather
from .tmem import TmemAlloc, TmemDealloc, TmemIndex, TmemLoad, TmemSlice, TmemStore, tmem_layout
from .warpgroups import CtaSync, NamedBarrierAlloc, NamedBarrierArrive, NamedBarrierSync, SetMaxRegisters, WarpgroupId
from .warps import WarpSplit
from .wgmma import Wgmma, WgmmaWait

__all__ = ["ArraySlice", "Atomic", "BarrierAlloc", "BarrierArrive", "BarrierArriveCluster", "BarrierWait", "Binary",
           "Broadcast", "Cast", "ClcQuery", "ClcTryCancel", "ClusterGather", "ClusterRank", "ClusterReduce",
           "ClusterSync", "Compare", "Constant", "CtaSync", "DeviceAssert", "FenceAsyncShared", "Fma", "For", "Gather",
           "If", "Iota", "Load", "NamedBarrierAlloc", "NamedBarrierArrive", "NamedBarrierSync", "NumPrograms", "Print",
           "ProfileEvent", "ProfileStart", "ProgramId", "Reduce", "ReduceAll", "RefDim", "RefIndex", "RefSlice",
           "RefTranspose", "RefWindow", "Relayout", "ScopedSmemAlloc", "Select", "SemaphoreWait", "SetMaxRegisters",
           "SmemAlloc", "SmemFree", "SmemLoad", "SmemStore", "Splat", "Squeeze", "Store", "Tcgen05Commit",
           "Tcgen05Copy", "Tcgen05Mma", "TmaDescriptorCut", "TmaGather", "TmaLoad", "TmaLoadCollective", "TmaPrefetch",
           "TmaStore", "TmaStoreWait", "TmemAlloc", "TmemDealloc", "TmemIndex", "TmemLoad", "TmemSlice", "TmemStore",
           "Unary", "WarpSplit", "WarpgroupId", "Wgmma", "WgmmaWait", "Yield", "tmem_layout"]
