"""The TMA side of tests/ptx_sim.py: tensor maps as the launch encodes them (a tensor's address, sizes and strides,
a box, a swizzle), and the bulk tensor copies that read them (cp.async.bulk.tensor) between global memory and a
CTA's shared memory, with their bulk groups and mbarrier completions.

A copy is asynchronous: the PTX memory model lets a load land any time between its issue and the completion its
mbarrier reports, and a store read its shared memory any time until its bulk group is waited on
(cp.async.bulk.wait_group.read). A store reads at the latest, so a kernel that writes a tile a store still reads
stores the new bytes; a load lands at one end of its window (`lands`): "late" when a thread first waits on its
mbarrier, so a kernel that reads a slot before its copy landed computes with stale bytes, "early" at the issue,
so a kernel that refills a slot that its threads or a store still read computes or stores the next row's bytes.
A test runs both. A CTA that exits with stores in flight raises, as the hardware leaves them undefined.
"""
from __future__ import annotations

import dataclasses
import struct

import numpy as np
from ptx_arith import SimError, as_int, as_uint

TMAP_BASE = 0xF000_0000_0000  # generic addresses of the tensor-map parameters (cvta.param): one 128-byte slot each
# A tensor map's 128 bytes in this simulator's own layout (the driver's is opaque): a marker, the address, rank,
# element size, swizzle, element type, then five sizes, strides and box dimensions, innermost first as
# tensormap.replace counts them.
_ENCODING = struct.Struct("<4sQIIII5I5Q5I")
_MARKER = b"TMAP"
_DTYPES = ("", "float32", "bfloat16", "float16", "float64", "int32", "int64", "uint8", "int8", "int16",
           "float8_e4m3fn", "float8_e5m2")


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """A TMA descriptor (cuTensorMapEncodeTiled with unit element strides and zero fill): sizes, strides (bytes) and
    box are outermost first, as mgjit's descriptors write them."""

    address: int
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    itemsize: int
    swizzle: int
    dtype: str = ""  # the element type's torch name: what a reduce-add adds as

    def __post_init__(self):
        inner = self.box[-1] * self.itemsize
        if self.address % 16 or any(s % 16 for s in self.strides[:-1]) or self.strides[-1] != self.itemsize:
            raise SimError(f"a tensor map needs a 16-byte aligned address, strides of multiples of 16 bytes and a "
                           f"contiguous last dimension, got {hex(self.address)}, strides {self.strides}")
        if inner % 16 or (self.swizzle and inner > self.swizzle) or any(not 1 <= b <= 256 for b in self.box):
            raise SimError(f"a TMA box of {self.box} ({inner} bytes a row) with a {self.swizzle}B swizzle")

    def encode(self) -> bytes:
        rank = len(self.sizes)
        pad = lambda v: list(reversed(v)) + [0] * (5 - rank)  # noqa: E731
        return _ENCODING.pack(_MARKER, self.address, rank, self.itemsize, self.swizzle, _DTYPES.index(self.dtype),
                              *pad(self.sizes), *pad(self.strides), *pad(self.box)).ljust(128, b"\0")

    @classmethod
    def decode(cls, raw: bytes) -> "TensorMap":
        marker, address, rank, itemsize, swizzle, dtype, *rest = _ENCODING.unpack(raw[:_ENCODING.size])
        if marker != _MARKER or not 1 <= rank <= 5:
            raise SimError("cp.async.bulk.tensor reads 128 bytes that are no tensor map (nothing copied one there)")
        sizes, strides, box = (tuple(reversed(rest[i:i + rank])) for i in (0, 5, 10))
        return cls(address, sizes, strides, box, itemsize, swizzle, _DTYPES[dtype])

    @property
    def box_bytes(self) -> int:
        return int(np.prod(self.box)) * self.itemsize

    def elements(self, coords: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """The box at `coords` (outermost first), element by element in its shared-memory order: (each element's
        global byte address, whether it lies inside the tensor)."""
        if len(coords) != len(self.box):
            raise SimError(f"a {len(self.box)}D tensor map used with {len(coords)} coordinates")
        index = np.indices(self.box).reshape(len(self.box), -1) + np.array(coords, dtype=np.int64)[:, None]
        inside = np.all((index >= 0) & (index < np.array(self.sizes)[:, None]), axis=0)
        address = self.address + (index * np.array(self.strides)[:, None]).sum(axis=0)
        return address, inside

    def smem_offsets(self, start: int) -> np.ndarray:
        """The shared-memory byte offsets of the box's bytes, in order, copied to `start`: dense rows, swizzled
        (each 16-byte chunk's index XORed with its offset's 128-byte row modulo swizzle / 16)."""
        if start % (1024 if self.swizzle == 128 else 128):
            raise SimError(f"a TMA copy to shared offset {start}, not aligned to "
                           f"{1024 if self.swizzle == 128 else 128} bytes")
        off = start + np.arange(self.box_bytes, dtype=np.int64)
        if self.swizzle:
            off ^= ((off >> 7) % (self.swizzle // 16)) << 4
        return off


@dataclasses.dataclass
class _Load:
    cta: object  # whose shared memory it lands in
    tmap: TensorMap
    coords: tuple[int, ...]
    dst: int
    barrier: int
    signalled: object  # the CTA whose mbarrier counts its bytes


@dataclasses.dataclass
class _Store:
    tmap: TensorMap
    coords: tuple[int, ...]
    src: int
    add: bool = False  # cp.reduce.async.bulk.tensor .add: added to what global memory holds


class TmaOps:
    """The CTA's (tests/ptx_sim.py) cp.async.bulk instructions: its parameters, registers and memory are the
    CTA's own; `pending_loads` and `groups` hold what is in flight (per CTA, and per thread)."""

    lands = "late"

    def tensormap(self, handle: int) -> TensorMap:
        """The tensor map at a generic address: a kernel parameter's, or one copied into global memory."""
        if int(handle) < TMAP_BASE:
            (off,) = self.mem.offsets(np.array([handle], dtype=np.uint64), 128)
            return TensorMap.decode(self.mem.bytes[off:off + 128].tobytes())
        slot, rest = divmod(int(handle) - TMAP_BASE, 128)
        if rest or not 0 <= slot < len(self.prog.tensormaps):
            raise SimError(f"cp.async.bulk.tensor reads a tensor map at {hex(int(handle))}, not a kernel parameter")
        return self.params[self.prog.tensormaps[slot]]

    def tensormap_bytes(self, address: int, nbytes: int) -> np.ndarray:
        """What a generic load reads from a tensor-map parameter (copying it into global memory)."""
        slot, offset = divmod(address - TMAP_BASE, 128)
        if not 0 <= slot < len(self.prog.tensormaps) or offset + nbytes > 128:
            raise SimError(f"a load of {nbytes} bytes at {hex(address)}, outside the tensor-map parameters")
        encoded = self.params[self.prog.tensormaps[slot]].encode()
        return np.frombuffer(encoded[offset:offset + nbytes], dtype=np.uint8)

    def op_tensormap(self, parts, ops, run):
        """tensormap.replace.tile.global_dim.global.b1024.b32 [map], ordinal, size: a dimension's size of a tensor
        map in global memory (ordinal 0 the innermost)."""
        if parts[1:4] != ["replace", "tile", "global_dim"]:
            raise SimError(f"the simulator does not know {'.'.join(parts)}")
        addr = self.address(ops[0])
        for lane in np.nonzero(run)[0]:
            (off,) = self.mem.offsets(addr[lane:lane + 1], 128)
            tmap = TensorMap.decode(self.mem.bytes[off:off + 128].tobytes())
            sizes = list(tmap.sizes)
            size = self.per_thread(ops[2])[lane]
            sizes[len(sizes) - 1 - int(self.value(ops[1]))] = int(size)
            encoded = dataclasses.replace(tmap, sizes=tuple(sizes)).encode()
            self.mem.bytes[off:off + 128] = np.frombuffer(encoded, dtype=np.uint8)

    def op_cp(self, parts, ops, run):
        if parts[1:4] == ["reduce", "async", "bulk"] and "add" in parts and "bulk_group" in parts:
            self._issue_stores(ops, run, add=True)
            return
        if parts[1:3] != ["async", "bulk"]:
            raise SimError(f"the simulator does not know {'.'.join(parts)}")
        if parts[3] == "commit_group":
            for lane in np.nonzero(run)[0]:
                self.groups.setdefault(int(lane), [[]]).append([])
            return
        if parts[3] == "wait_group":
            keep = int(self.value(ops[0]))
            for lane in np.nonzero(run)[0]:
                self._drain(int(lane), keep)
            return
        # A CTA pair's copy (cta_group::2) is a copy whose mbarrier may be the peer's
        parts = [p for p in parts if not p.startswith("cta_group::")]
        if parts[3] != "tensor" or "im2col" in parts:
            raise SimError(f"the simulator does not know {'.'.join(parts)}")
        if parts[5:7] == ["shared::cluster", "global"]:
            self._issue_loads(ops, run, "multicast::cluster" in parts)
        elif parts[5:7] == ["global", "shared::cta"] and "bulk_group" in parts:
            self._issue_stores(ops, run)
        else:
            raise SimError(f"the simulator does not know {'.'.join(parts)}")

    def _tensor_operand(self, op: str) -> tuple[np.ndarray, list[np.ndarray]]:
        """[tmap, {c0, c1, ...}] (innermost coordinate first): each thread's map handle and coordinates."""
        handle, coords = op.strip()[1:-1].split(",", 1)
        values = [np.broadcast_to(as_int(as_uint(self.value(c.strip()), 32), 32, True), (self.threads,))
                  for c in coords.strip().strip("{}").split(",")]
        return self.per_thread(handle.strip()), values[::-1]

    def _issue_loads(self, ops, run, multicast: bool):
        """Loads into this CTA's slot, or with multicast into the same offsets of each CTA of the mask (its slot,
        its mbarrier)."""
        handles, coords = self._tensor_operand(ops[1])
        dst, bar = self.address(ops[0]), self.address(ops[2])
        masks = self.per_thread(ops[3], 16) if multicast else None
        for lane in np.nonzero(run)[0]:
            (home, dst_offset), (holder, bar_offset) = self.peer(int(dst[lane])), self.peer(int(bar[lane]))
            if home is not self:
                raise SimError("a TMA load names another CTA's shared memory: multicast names CTAs by its mask")
            ranks = [r for r in range(len(self.cluster)) if int(masks[lane]) >> r & 1] if multicast else [None]
            if multicast and (not ranks or int(masks[lane]) >> len(self.cluster)):
                raise SimError(f"a multicast TMA load to CTAs {int(masks[lane]):#x} of a cluster of "
                               f"{len(self.cluster)}")
            for r in ranks:
                # Into this CTA (its mbarrier there, or, for a CTA pair's MMA, the pair leader's), or with multicast
                # into each CTA of the mask at the same offsets
                cta, signalled = (self, holder) if r is None else (self.cluster[r], self.cluster[r])
                load = _Load(cta, self.tensormap(handles[lane]), tuple(int(c[lane]) for c in coords), dst_offset,
                             bar_offset, signalled)
                if load.coords[-1] * load.tmap.itemsize % 16:  # an H200 faults: illegal instruction
                    raise SimError(f"a TMA load's box starts at element {load.coords[-1]} of its tensor's innermost "
                                   f"dimension, {load.coords[-1] * load.tmap.itemsize} bytes in: not a multiple of 16")
                self._barrier(signalled, bar_offset)  # an mbarrier must be there at the issue
                if self.lands == "early":
                    cta._land(load)
                else:
                    signalled.pending_loads.append(load)

    def land_loads(self, offset: int) -> None:
        """Land the loads in flight to this CTA's mbarrier at `offset` (a thread waits on it)."""
        for load in [p for p in self.pending_loads if p.barrier == offset]:
            self.pending_loads.remove(load)
            load.cta._land(load)

    def _land(self, load: _Load) -> None:
        tmap = load.tmap
        address, inside = tmap.elements(load.coords)
        data = np.zeros((len(address), tmap.itemsize), dtype=np.uint8)
        if inside.any():
            off = self.mem.offsets(address[inside].astype(np.uint64), tmap.itemsize)
            data[inside] = self.mem.bytes[off[:, None] + np.arange(tmap.itemsize)]
        offsets = tmap.smem_offsets(load.dst)
        if offsets.max() >= len(self.smem):
            raise SimError("a TMA load past the end of shared memory")
        self.smem[offsets] = data.reshape(-1)
        self._barrier(load.signalled, load.barrier).complete_tx(tmap.box_bytes)

    def _issue_stores(self, ops, run, add: bool = False):
        handles, coords = self._tensor_operand(ops[0])
        src = self.address(ops[1])
        for lane in np.nonzero(run)[0]:
            store = _Store(self.tensormap(handles[lane]), tuple(int(c[lane]) for c in coords), int(src[lane]), add)
            self.groups.setdefault(int(lane), [[]])[-1].append(store)

    def _drain(self, lane: int, keep: int) -> None:
        """cp.async.bulk.wait_group[.read] keep: all but the newest `keep` committed groups of the thread are done."""
        groups = self.groups.get(lane, [[]])
        committed, current = groups[:-1], groups[-1]
        done = committed[:max(len(committed) - keep, 0)]
        for group in done:
            for store in group:
                self._write_out(store)
        self.groups[lane] = committed[len(done):] + [current]

    def _write_out(self, store: _Store) -> None:
        tmap = store.tmap
        data = self.smem[tmap.smem_offsets(store.src)].reshape(-1, tmap.itemsize)
        address, inside = tmap.elements(store.coords)
        off = self.mem.offsets(address[inside].astype(np.uint64), tmap.itemsize)
        self.mem.check_store(off, tmap.itemsize)
        at = (off[:, None] + np.arange(tmap.itemsize)).reshape(-1)
        new = data[inside].reshape(-1)
        if store.add:
            import torch
            if not tmap.dtype.startswith(("float", "bfloat")):
                raise SimError(f"a TMA reduce-add into {tmap.dtype or 'an untyped tensor'}: the simulator adds floats")
            dtype = getattr(torch, tmap.dtype)
            old, add = (torch.from_numpy(b.copy()).view(dtype) for b in (self.mem.bytes[at], new))
            new = (old.double() + add.double()).to(dtype).view(torch.uint8).numpy()  # one rounding: exact f32 sum
        self.mem.bytes[at] = new
        self.mem.writes[at] += 1

    def tma_exit(self) -> None:
        """The CTA's threads have exited: no store may still read its shared memory."""
        if any(store for groups in self.groups.values() for group in groups for store in group):
            raise SimError("a CTA exited with TMA stores in flight (no cp.async.bulk.wait_group.read for them): "
                           "they read shared memory that is gone")
