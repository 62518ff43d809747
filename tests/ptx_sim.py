"""A small SIMT simulator of the PTX mgjit emits, so that the lowering (the GMEM byte shuffling, DSMEM exchanges,
TMA rings, warp-specialized MMA pipelines) is checked on the CPU, instruction by instruction, as a GPU would run
it.

It runs the threads of a CTA in lockstep: all threads at the lowest program counter execute the next
instruction together, so forward branches reconverge where they join. A thread whose mbarrier wait fails stays
at it while the others run, and the warpgroups that ran last run on until they wait (`CTA.run` says which
schedule that makes). The CTAs of a cluster take turns, each running until all its threads wait: at a cluster
barrier (which it passes once every CTA of the cluster is there) or on an mbarrier phase that has not completed
(st.async and TMA loads count their bytes on the receiving CTA's mbarrier). Named barriers count their arrivals
(tests/ptx_cluster.py), TMA copies land as late or as early as the memory model lets them (tests/ptx_tma.py),
wgmma runs at its issue and checks that what it read is unchanged when it is waited for (tests/ptx_wgmma.py),
tcgen05 MMAs and loads work on each CTA's tensor memory (tests/ptx_tcgen05.py), and cluster launch control
cancels clusters that have not launched (tests/ptx_clc.py). A call to a function the module defines (a libdevice
routine LLVM keeps out of line) runs its code with each thread's return address kept, its .param variables as bits
(tests/ptx_calls.py).
Registers are numpy arrays over the threads, typed by the names LLVM gives them (%p pred, %rs b16, %r b32, %rd
b64, %f f32, %fd f64); a float instruction reads an integer register's bits. Global memory is one byte arena: an
access not aligned to its size, outside it, a load touching no placed tensor or a store outside every placed
tensor raises, as the hardware faults (or should). `shfl.sync` must find every lane of its warp at the
instruction, a cluster barrier every thread. Memory, shuffles and control flow are here; arithmetic is in
tests/ptx_arith.py. It raises on any instruction it does not know; ex2/lg2/rsqrt/rcp .approx are exact in f32
(as in the interpreter). Atomics run thread by thread; memory-ordering qualifiers (ld.acquire, atom.acq_rel) are
accepted and ignored: CTAs run one after another, so a semaphore wait for a later CTA (a spin loop) is out of its
reach.
"""
from __future__ import annotations

import itertools
import random
import re
import struct
from collections import Counter
from typing import Any

import numpy as np
from ptx_arith import (INT, Arithmetic, SimError, as_int, as_uint, atomic_result, bits_dtype, convert_bits,
                       float_dtype, narrow_to_f32)
from ptx_calls import MAX_CALL_DEPTH, CallOps
from ptx_clc import ClcOps, ClusterQueue
from ptx_cluster import ClusterOps, MBarrier, run_cluster
from ptx_memory import Memory, SmemRaces, shared_offsets, unordered
from ptx_program import Program
from ptx_tma import TMAP_BASE, TensorMap, TmaOps
from ptx_tcgen05 import Tcgen05Ops
from ptx_wgmma import WgmmaOps

_REG = re.compile(r"%(p|rs|rd|r|fd|f)(\d+)$|%(SPL?)$")  # %SP, %SPL: the stack pointers of local memory
_REG_DTYPE = {"p": np.bool_, "rs": np.uint16, "r": np.uint32, "rd": np.uint64, "f": np.float32, "fd": np.float64,
              "SP": np.uint64, "SPL": np.uint64}


class CTA(ClusterOps, ClcOps, TmaOps, WgmmaOps, Tcgen05Ops, CallOps, Arithmetic):
    def __init__(self, prog: Program, params: dict[str, Any], mem: Memory, ctaid: tuple[int, int, int],
                 nctaid: tuple[int, int, int], smem_bytes: int, cluster: list["CTA"] | None = None, rank: int = 0,
                 threads: int = 128, counts: Counter | None = None):
        self.prog, self.params, self.mem = prog, params, mem
        self.counts = counts  # opcode -> instructions issued, in steps of all the CTA's warps (see run)
        self.threads = threads
        self.ctaid, self.nctaid = ctaid, nctaid
        self.cluster = cluster if cluster is not None else [self]  # the CTAs of its cluster, by rank
        self.rank = rank
        self.smem = np.zeros(max(smem_bytes, 16), dtype=np.uint8)
        self.races = SmemRaces(threads, len(self.smem)) if not prog.async_smem else None
        self.local = np.zeros((threads, max(prog.local_bytes, 16)), dtype=np.uint8)  # each thread's own
        self.mbarriers: dict[int, MBarrier] = {}  # by SMEM offset
        self.named: dict[int, list] = {}  # named barriers mid-phase: [threads arrived, waiters, all arrivers]
        self.released = np.zeros(threads, dtype=bool)  # waiters a named barrier let go in the last step
        self.pending_loads: list = []  # TMA loads in flight (ptx_tma.py)
        self.groups: dict[int, list[list]] = {}  # each thread's TMA stores in flight, by bulk group
        self.wgmma_groups: dict[int, list[list]] = {}  # each warpgroup's MMAs in flight (ptx_wgmma.py)
        self.tmem = np.zeros((128, 512), dtype=np.uint32)  # tensor memory (ptx_tcgen05.py)
        self.tmem_used = 0
        self.regs: dict[str, np.ndarray] = {}
        self.tid = np.arange(threads, dtype=np.uint32)
        # Calls (ptx_program: functions after the kernel): each thread's return addresses, the bits of the .param
        # variables a call passes and returns, and each call's (return variable, callee's return parameter) by the
        # address it returns to
        self.returns = np.zeros((threads, MAX_CALL_DEPTH), dtype=np.int64)
        self.depth = np.zeros(threads, dtype=np.int64)
        self.param_space: dict[str, np.ndarray] = {}
        self.call_sites: dict[int, tuple[str | None, str | None]] = {}
        self.at = 0  # the instruction being run

    # -- operands
    def reg(self, name: str) -> np.ndarray:
        if name not in self.regs:
            m = _REG.match(name)
            if not m and name not in self.prog.declared:
                raise SimError(f"unknown register {name}")
            dtype = _REG_DTYPE[m.group(1) or m.group(3)] if m else self.prog.declared[name]
            self.regs[name] = np.zeros(self.threads, dtype=dtype)
        return self.regs[name]

    def value(self, op: str, dtype=None):
        op = op.strip()
        if op.startswith("%"):
            special = {"%tid.x": self.tid, "%ntid.x": np.uint32(self.threads), "%laneid": self.tid % 32,
                       "%ctaid.x": np.uint32(self.ctaid[0]), "%ctaid.y": np.uint32(self.ctaid[1]),
                       "%ctaid.z": np.uint32(self.ctaid[2]), "%nctaid.x": np.uint32(self.nctaid[0]),
                       "%nctaid.y": np.uint32(self.nctaid[1]), "%nctaid.z": np.uint32(self.nctaid[2]),
                       "%tid.y": np.uint32(0), "%tid.z": np.uint32(0), "%cluster_ctarank": np.uint32(self.rank)}
            if op in special:
                return special[op]
            return self.reg(op)
        if op.startswith("0f"):
            return np.frombuffer(struct.pack("<I", int(op[2:], 16)), dtype=np.float32)[0]
        if op.startswith("0d"):
            return np.frombuffer(struct.pack("<Q", int(op[2:], 16)), dtype=np.float64)[0]
        if op in self.prog.declared:
            return self.reg(op)
        if op.startswith("__mgjit_smem"):
            return np.uint64(int(op[len("__mgjit_smem"):].lstrip("+") or 0))
        if op in self.prog.tensormaps:  # mov.b64 %rd, tmap_param: its address (cvta.param)
            return np.uint64(TMAP_BASE + 128 * self.prog.tensormaps.index(op))
        if op in self.prog.depots:  # mov.b64 %SPL, __local_depot0: an address in the local space
            return np.uint64(self.prog.depots[op])
        if op in self.prog.global_addresses:  # mov.b64 %rd, __cudart_sin_cos_coeffs: a module global's address
            return np.uint64(self.prog.global_addresses[op])
        n = int(op.rstrip("U"), 0)
        if dtype is not None:
            return np.array(n).astype(np.int64).astype(dtype) if n < 0 else np.array(n, dtype=np.uint64).astype(dtype)
        return n

    def per_thread(self, op: str, bits: int | None = None) -> np.ndarray:
        """An operand's value in each thread (an immediate or a CTA-wide special register broadcast), as unsigned
        `bits`-bit integers where given."""
        v = self.value(op)
        return np.broadcast_to(np.asarray(v) if bits is None else as_uint(v, bits), (self.threads,))

    def fvalue(self, op: str, t: str) -> np.ndarray:
        """An operand of a floating-point instruction of type t: integer registers hold its bits (bf16 read as
        f32)."""
        if t == "bf16":
            return narrow_to_f32(as_uint(np.asarray(self.value(op)), 16), "bf16")
        dt = float_dtype(t)
        x = np.asarray(self.value(op))
        if x.dtype.kind in "ui":
            x = as_uint(x, np.dtype(dt).itemsize * 8).astype(INT[np.dtype(dt).itemsize * 8][0]).view(dt)
        return x.astype(dt)

    def address(self, op: str) -> np.ndarray:
        inner = op.strip()[1:-1].replace(" ", "")
        m = re.match(r"^([%\w]+)(?:\+(-?\d+))?$", inner)
        if not m:
            raise SimError(f"cannot read the address {op}")
        base, off = m.group(1), int(m.group(2) or 0)
        if base.startswith("%"):
            return self.reg(base).astype(np.uint64) + np.uint64(off & (2**64 - 1))
        if base == "__mgjit_smem":
            return np.full(self.threads, off, dtype=np.uint64)
        return base, off

    def write(self, name: str, value, mask: np.ndarray) -> None:
        if name == "_":  # the sink register
            return
        r = self.reg(name)
        v = np.broadcast_to(np.asarray(value), (self.threads,))
        if v.dtype != r.dtype:
            v = convert_bits(v, r.dtype)
        r[mask] = v[mask]

    # -- running
    def run(self, max_steps: int = 10_000_000):
        """A generator: it yields "cluster" at each barrier.cluster.wait, where the cluster's CTAs meet, and "spin"
        where every thread waits on an mbarrier (or at a barrier for one that does): another CTA must run first
        ("stuck" where nothing ran since it last yielded).
        A thread whose mbarrier wait fails stays at it while the CTA's other threads run (a producer warpgroup
        while its consumers wait for its copies), and tries again once a phase completes or they are stuck too.
        The warpgroups that ran the last instruction run on until they wait (a producer runs ahead as far as its
        slots let it), and threads that an arrival let through run first (it refills a slot the moment it is
        given back): the schedule that makes a slot given back too early show."""
        pc = np.zeros(self.threads, dtype=np.int64)
        active = np.ones(self.threads, dtype=bool)
        waiting = np.zeros(self.threads, dtype=bool)  # at a shfl.sync or cluster barrier for threads still elsewhere
        parked = np.zeros(self.threads, dtype=bool)  # at an mbarrier wait that failed
        barred = np.zeros(self.threads, dtype=bool)  # at a named barrier's sync, its count not reached
        progressed = True  # some thread got past an instruction since the parked ones last tried again
        moved = True  # ... since this CTA last let the others of its cluster run
        phases = 0  # mbarrier phases completed: the parked threads try again as soon as one completes
        eager = np.zeros(self.threads, dtype=bool)  # let through by an arrival: they run first
        current = np.zeros(self.threads, dtype=bool)  # the warpgroups that ran the last instruction
        steps = 0
        while active.any():
            steps += 1
            if steps > max_steps:
                raise SimError("too many steps (a hang?)")
            free = active & ~waiting & ~parked & ~barred
            if barred.any() and not free.any() and not parked.any():
                raise SimError(f"threads wait at named barriers {sorted(self.named)} that the others never reach")
            if parked.any() and not free.any():
                if not progressed:  # a round of tries in which no wait passed: another CTA must run
                    yield "spin" if moved else "stuck"  # stuck: nothing ran since it last let the others run
                    moved = False
                parked[:] = False
                progressed = False
                continue
            pick = next((p for p in (free & eager, free & current) if p.any()), free)
            at = int(pc[pick if pick.any() else active].min())
            mask = active & (pc == at) & ~barred
            if at >= len(self.prog.code):
                raise SimError("ran off the end of the kernel")
            guard, opcode, operands = self.prog.code[at]
            self.at = at
            if self.counts is not None:  # in warps issuing it, a CTA's worth of them counting 1
                self.counts[opcode] += int(mask.reshape(-1, 32).any(axis=1).sum()) / (self.threads // 32)
            if free.any() and self._joins_later(opcode, operands, mask, active, pc, at):
                waiting |= mask
                continue
            waiting &= ~mask
            current = np.repeat(mask.reshape(-1, 128).any(axis=1), 128) if self.threads % 128 == 0 else mask
            run = mask.copy()
            if guard is not None:
                g = self.reg(guard[1])
                run &= ~g if guard[0] else g
            try:
                nxt = self.step(opcode, operands, run, mask, active)
                if isinstance(nxt, np.ndarray):  # brx.idx: each thread's own target
                    targets, nxt = nxt, "jump"
            except SimError as e:
                if "(at instruction" in str(e):
                    raise
                raise SimError(f"{e} (at instruction {at}: {opcode} {', '.join(map(str, operands))})") from e
            except Exception as e:  # an operand form or type the arithmetic does not cover
                raise SimError(f"the simulator does not know {opcode} {', '.join(map(str, operands))} "
                               f"({type(e).__name__}: {e})") from e
            if opcode.startswith(("mbarrier", "cp.", "st.async")):
                now = sum(b.completed for b in self.mbarriers.values())
                if now != phases:
                    if opcode.startswith("mbarrier.arrive"):  # at a wait, parked or about to try again
                        eager |= active & (parked | np.isin(pc, self.prog.waits))
                    parked[:], phases = False, now
            if self.released.any():  # waiters at other instructions go on past them
                pc[self.released & ~mask] += 1
                barred &= ~self.released
                self.released[:] = False
            if nxt == "hold":  # at a named barrier that others have yet to reach
                barred |= self.held
                pc[mask & ~self.held] = at + 1
                progressed = moved = True
                continue
            if nxt == "spin":  # the threads whose wait failed stay at it; the others go on
                parked |= self.spinning
                eager &= ~self.spinning
                progressed |= bool((mask & ~self.spinning).any())
                moved |= bool((mask & ~self.spinning).any())
                pc[mask & ~self.spinning] = at + 1
                continue
            progressed = moved = True
            if nxt == "cluster":
                yield nxt
                nxt = None
            if nxt == "exit":
                active &= ~run
                pc[mask & ~run] = at + 1
            elif nxt is not None:
                pc[run] = targets[run] if nxt == "jump" else nxt
                pc[mask & ~run] = at + 1
            else:
                pc[mask] = at + 1
        self.tma_exit()

    def _joins_later(self, opcode: str, ops: list, mask, active, pc, at: int) -> bool:
        """Whether threads at `at` wait there for others that are at other instructions: a shfl.sync or a
        bar.warp.sync for the active lanes of its warps (a divergent branch left them behind, or lanes that skipped
        a branch ran ahead around a loop; the hardware makes them meet), a cluster barrier
        for every thread of the CTA (warp-specialized code reaches the kernel's last one from its producer's branch
        before its consumers do). Named barriers count their arrivals instead (ptx_cluster.named_barrier)."""
        if opcode.startswith("barrier.cluster"):
            return bool((active & (pc != at)).any())
        if not opcode.startswith(("shfl.sync", "bar.warp.sync")):
            return False
        warps = np.repeat(mask.reshape(-1, 32).any(axis=1), 32)
        return bool((active & warps & (pc != at)).any())

    def step(self, opcode: str, ops: list, run: np.ndarray, mask: np.ndarray, active: np.ndarray):
        parts = opcode.split(".")
        name = parts[0]
        if name == "bra":
            return self.prog.labels[ops[0]]
        if name == "brx":  # brx.idx %r, table: each thread to its entry (a warp-role switch diverges)
            targets = np.array([self.prog.labels[t] for t in self.prog.branchtargets[ops[1]]])
            index = self.per_thread(ops[0]).astype(np.int64)
            if (index[run] >= len(targets)).any() or (index[run] < 0).any():
                raise SimError(f"brx.idx past its {len(targets)} targets")
            return targets[np.clip(index, 0, len(targets) - 1)]
        if name == "call":
            return self.call(ops, run)
        if name == "ret" and (self.depth[run] > 0).any():
            return self.ret(run)
        if name in ("ret", "exit"):
            return "exit"
        if name == "trap":  # a failed mgjit.device_assert: the launch fails
            if run.any():
                raise SimError(f"trap in {int(run.sum())} threads")
            return None
        if name == "bar" or name == "barrier" and not opcode.startswith("barrier.cluster"):
            return self.named_barrier(opcode, ops, run, active)
        if name == "barrier":
            if not (mask == active).all() or run.any() and not (run == active).all():
                raise SimError(f"{opcode} reached by only some threads")
            if self.races:  # barrier.sync: the CTA's threads meet
                self.races.barrier(mask)
            return "cluster" if opcode.startswith("barrier.cluster.wait") and run.any() else None
        if name == "mbarrier":
            return self.mbarrier(parts, ops, run)
        if name == "shfl":
            self.shfl(parts, ops, run, mask)
            return None
        handler = getattr(self, "op_" + name, None)
        if handler is None:
            raise SimError(f"the simulator does not know {opcode}")
        handler(parts, ops, run)
        return None

    # -- instructions
    def op_mov(self, parts, ops, run):
        t = parts[-1]
        if ops[0].startswith("{"):  # unpack: mov.b32 {%rs1, %rs2}, %r1
            outs = [o.strip() for o in ops[0][1:-1].split(",")]
            src = self.value(ops[1]).astype(np.uint64)
            bits = 64 // len(outs) if t == "b64" else 32 // len(outs)
            for i, o in enumerate(outs):
                self.write(o, (src >> np.uint64(i * bits)) & np.uint64((1 << bits) - 1), run)
            return
        if t == "b128":  # mov.b128 r, {lo, hi}: a 128-bit register as its two halves (ptx_program.Program)
            for half, o in zip(("lo", "hi"), ops[1][1:-1].split(",")):
                self.write(f"{ops[0]}:{half}", as_uint(self.value(o.strip()), 64), run)
            return
        if ops[1].startswith("{"):  # pack
            ins = [self.value(o.strip()) for o in ops[1][1:-1].split(",")]
            bits = (64 if t == "b64" else 32) // len(ins)
            acc = np.zeros(self.threads, dtype=np.uint64)
            for i, x in enumerate(ins):
                acc |= (np.broadcast_to(as_uint(x, bits), (self.threads,)).astype(np.uint64)) << np.uint64(i * bits)
            self.write(ops[0], acc, run)
            return
        src = self.value(ops[1], bits_dtype(t))
        self.write(ops[0], src, run)

    def op_ld(self, parts, ops, run):
        parts = [p for p in unordered(parts) if p != "nc"]  # ld.global.nc: through the read-only cache, the same bytes
        space = parts[1]
        if space == "param::func" or space == "param" and ops[1][1:-1] in self.param_space:  # a call's .param
            self.write(ops[0], self.param(ops[1][1:-1]), run)
            return
        if space in ("param", "param::entry"):  # from PTX ISA 8.3, LLVM loads kernel parameters as ld.param::entry
            v = self.params[ops[1][1:-1]]
            t = parts[-1]
            if isinstance(v, float) and not t.startswith("f"):  # a float parameter read as its bits (ld.b32)
                v = int(np.array(v, dtype=np.float32 if t.endswith("32") else np.float64).view(INT[int(t[1:])][0]))
            self.write(ops[0], np.array(v, dtype=float_dtype(t)) if t.startswith("f") else
                       np.uint64(int(v) & (2**64 - 1)), run)
            return
        if not space.startswith(("global", "shared", "local")):  # a generic address: ld.v4.b32
            space = "generic"
            parts = [parts[0], space, *parts[1:]]
        vec = int(parts[2][1:]) if parts[2].startswith("v") else 1
        t = parts[-1]
        bits = 8 if t in ("u8", "s8", "b8") else int(t[1:])
        nbytes = bits // 8 * vec
        outs = [o.strip() for o in ops[0].strip("{}").split(",")]
        addr = self.address(ops[1])
        words = self._read(space, addr, nbytes, run)
        for i, o in enumerate(outs):
            part = words[:, i * bits // 8:(i + 1) * bits // 8]
            val = np.zeros(self.threads, dtype=np.uint64)
            for b in range(bits // 8):
                val |= part[:, b].astype(np.uint64) << np.uint64(8 * b)
            self.write(o, as_int(val, bits, True) if t[0] == "s" else val, run)  # ld.s8 sign-extends

    def op_st(self, parts, ops, run):
        if parts[1] == "async":
            self.st_async(ops, run)
            return
        parts = unordered(parts)
        space = parts[1]
        if space in ("param", "param::func"):  # a call's .param variable: the value's bits
            bits = int(parts[-1][1:])
            value = np.broadcast_to(as_uint(self.value(ops[1]), bits), (self.threads,)).astype(np.uint64)
            self.set_param(ops[0][1:-1], value, run)
            return
        vec = int(parts[2][1:]) if parts[2].startswith("v") else 1
        t = parts[-1]
        bits = 8 if t in ("u8", "s8", "b8") else int(t[1:])
        ins = [o.strip() for o in ops[1].strip("{}").split(",")]
        addr = self.address(ops[0])
        data = np.zeros((self.threads, bits // 8 * vec), dtype=np.uint8)
        for i, o in enumerate(ins):
            val = np.broadcast_to(as_uint(self.value(o), max(bits, 8)), (self.threads,)).astype(np.uint64)
            for b in range(bits // 8):
                data[:, i * bits // 8 + b] = ((val >> np.uint64(8 * b)) & np.uint64(255)).astype(np.uint8)
        self._write(space, addr, data, run)

    def _read(self, space, addr, nbytes, run) -> np.ndarray:
        out = np.zeros((self.threads, nbytes), dtype=np.uint8)
        idx = np.nonzero(run)[0]
        if not len(idx):
            return out
        if space == "generic":  # a tensor-map parameter's bytes, or global memory
            if all(int(a) >= TMAP_BASE for a in addr[idx]):
                for lane in idx:
                    out[lane] = self.tensormap_bytes(int(addr[lane]), nbytes)
                return out
            space = "global"
        if space == "global":
            off = self.mem.offsets(addr[idx], nbytes)
            if self.mem.allocations:
                touches = np.zeros(len(off), dtype=bool)
                for lo, hi in self.mem.allocations:
                    touches |= (off < hi) & (off + nbytes > lo)
                if not touches.all():
                    raise SimError(f"a load of {nbytes} bytes that touches no allocation, at offset {off[~touches][0]}")
            out[idx] = self.mem.bytes[off[:, None] + np.arange(nbytes)]
        elif space == "shared::cluster":
            for lane, a in zip(idx, addr[idx].astype(np.int64)):
                cta, offset = self.peer(int(a))
                o = int(shared_offsets(np.array([offset]), nbytes, len(cta.smem))[0])
                out[lane] = cta.smem[o:o + nbytes]
        elif space == "local":
            off = shared_offsets(addr[idx], nbytes, self.local.shape[1])
            out[idx] = self.local[idx[:, None], off[:, None] + np.arange(nbytes)]
        else:
            off = shared_offsets(addr[idx], nbytes, len(self.smem))
            if self.races:
                self.races.load(idx, off, nbytes)
            out[idx] = self.smem[off[:, None] + np.arange(nbytes)]
        return out

    def _write(self, space, addr, data, run) -> None:
        idx = np.nonzero(run)[0]
        if not len(idx):
            return
        nbytes = data.shape[1]
        if space == "shared::cluster":
            for lane, a in zip(idx, addr[idx].astype(np.int64)):
                cta, offset = self.peer(int(a))
                o = int(shared_offsets(np.array([offset]), nbytes, len(cta.smem))[0])
                cta.smem[o:o + nbytes] = data[lane]
            return
        if space == "local":
            for lane, o in zip(idx, shared_offsets(addr[idx], nbytes, self.local.shape[1])):
                self.local[lane, o:o + nbytes] = data[lane]
            return
        target = self.mem.bytes if space == "global" else self.smem
        off = self.mem.offsets(addr[idx], nbytes) if space == "global" else \
            shared_offsets(addr[idx], nbytes, len(self.smem))
        if space == "global":
            self.mem.check_store(off, nbytes)
        for lane, o in zip(idx, off):  # in lane order: the last writer of a byte wins, as the hardware picks one
            target[o:o + nbytes] = data[lane]
            if space == "global":
                self.mem.writes[o:o + nbytes] += 1
            elif self.races:
                self.races.store(lane, o, nbytes)

    def shfl(self, parts, ops, run, mask):
        mode = parts[2]
        for w in range(self.threads // 32):
            lanes = mask[w * 32:(w + 1) * 32]
            if lanes.any() and not lanes.all():
                raise SimError("shfl.sync in divergent code")
        a = self.value(ops[1]).astype(np.uint32)
        b = int(self.value(ops[2])) if not ops[2].startswith("%") else self.value(ops[2])
        c = int(self.value(ops[3]))
        lane = self.tid % 32
        clamp, segmask = c & 0x1F, (c >> 8) & 0x1F
        max_lane = (lane & segmask) | (clamp & ~segmask)
        min_lane = lane & segmask
        if mode == "up":
            j = lane.astype(np.int64) - b
            ok = j >= min_lane
        elif mode == "down":
            j = lane.astype(np.int64) + b
            ok = j <= max_lane
        elif mode == "bfly":
            j = (lane ^ np.uint32(b)).astype(np.int64)
            ok = j <= max_lane
        else:
            j = ((np.uint32(b) & ~np.uint32(segmask)) | min_lane).astype(np.int64)
            ok = j <= max_lane
        src = np.where(ok, (self.tid - lane).astype(np.int64) + j, self.tid.astype(np.int64))
        self.write(ops[0], np.broadcast_to(a, (self.threads,))[src], run)

    def op_atom(self, parts, ops, run):
        """atom[.sem][.scope].global.op.type d, [a], b[, c] and the vector f32 add atom.global.vN.f32.add: thread
        by thread in thread order, element by element, each read-modify-write indivisible; d gets the old
        values. (The threads of one instruction are unordered on a GPU: a test must accept any order.)"""
        parts = unordered(parts)
        if parts[1] != "global":
            raise SimError(f"{'.'.join(parts)}: only global atomics")
        vec = int(parts[2][1:]) if parts[2].startswith("v") else 1
        kind, t = (parts[-1], parts[-2]) if vec > 1 else (parts[2], parts[-1])
        bits = int(t.lstrip("bfus"))
        nbytes = bits // 8
        outs = [o.strip() for o in ops[0].strip("{}").split(",")]
        values = [self.per_thread(o.strip(), bits)
                  for o in ops[-1].strip("{}").split(",")]
        compare = self.per_thread(ops[2], bits) if kind == "cas" else None
        addr = self.address(ops[1])
        olds = np.zeros((vec, self.threads), dtype=np.uint64)
        for lane in np.nonzero(run)[0]:
            (off,) = self.mem.offsets(addr[lane:lane + 1], nbytes * vec)
            self.mem.check_store(np.array([off]), nbytes * vec)
            for j in range(vec):
                at = int(off) + j * nbytes
                old = int.from_bytes(self.mem.bytes[at:at + nbytes].tobytes(), "little")
                cmp = None if compare is None else int(compare[lane])
                new = atomic_result(kind, t, old, int(values[j][lane]), cmp)
                self.mem.bytes[at:at + nbytes] = np.frombuffer(new.to_bytes(nbytes, "little"), dtype=np.uint8)
                self.mem.writes[at:at + nbytes] += 1
                olds[j, lane] = old
        for j, o in enumerate(outs):
            self.write(o, olds[j], run)

    def op_fence(self, parts, ops, run):
        """Fences order memory; the simulator's accesses are already sequentially consistent."""


def launch(ptx: str, grid: tuple[int, ...], args: list, mem: Memory, smem_bytes: int,
           cluster: int | tuple[int, ...] = 1, threads: int = 128, counts: Counter | None = None,
           lands: str = "late", order: int | None = None) -> None:
    """Run a kernel over `grid`: args are the kernel's parameter values in ABI order (pointers as ints, tensor maps
    as ptx_tma.TensorMap). Clusters are boxes of `cluster` CTAs (a number: along x), ranked x fastest, launched in
    order (x fastest, or, with `order`, in an order drawn from that seed: a GPU promises none), each run to its end
    before the next, skipping those a try_cancel cancelled (ptx_clc.py); their CTAs run in turns
    (ptx_cluster.run_cluster). `counts` (if given) gathers the instructions issued, by opcode; `lands` is when TMA
    copies land (ptx_tma.py)."""
    if lands not in ("early", "late"):
        raise ValueError(f"lands is 'early' or 'late', got {lands!r}")
    prog = Program(ptx)
    top = len(mem.bytes)  # the module's initialized globals, from the arena's top end down
    for name, data in prog.globals.items():
        top = (top - len(data)) // 256 * 256
        mem.bytes[top:top + len(data)] = np.frombuffer(data, dtype=np.uint8)
        if (top, top + len(data)) not in mem.allocations:
            mem.allocations.append((top, top + len(data)))
        prog.global_addresses[name] = mem.base + top
    if len(args) != len(prog.params):
        raise SimError(f"the kernel takes {len(prog.params)} parameters, got {len(args)}")
    params = dict(zip(prog.params, args))
    grid = tuple(grid) + (1,) * (3 - len(grid))
    box = (cluster,) if isinstance(cluster, int) else tuple(cluster)
    box = box + (1,) * (3 - len(box))
    if any(g % c for g, c in zip(grid, box)):
        raise SimError(f"a grid of {grid} is not a whole number of clusters of {box}")
    origins = [(x0, y0, z0) for z0 in range(0, grid[2], box[2]) for y0 in range(0, grid[1], box[1])
               for x0 in range(0, grid[0], box[0])]
    if order is not None:
        random.Random(order).shuffle(origins)
    launches = ClusterQueue(origins)
    while (origin := launches.launch()) is not None:
        x0, y0, z0 = origin
        ctas: list[CTA] = []
        for r, (k, j, i) in enumerate(itertools.product(range(box[2]), range(box[1]), range(box[0]))):
            ctas.append(CTA(prog, params, mem, (x0 + i, y0 + j, z0 + k), grid, smem_bytes, ctas, r, threads, counts))
            ctas[-1].lands, ctas[-1].launches = lands, launches
        run_cluster(ctas)


class Device:
    """Tensors in a simulated global memory: place a CPU tensor's storage once, pass views of it to `run`, read it
    back with `fetch`. A tensor keeps its address modulo 64 (CPU storage is 64-byte aligned), so the
    specialization a kernel compiles for on the CPU tensors holds for the placed ones."""

    def __init__(self, size: int = 16 << 20):
        self.mem = Memory(size)
        self.bases: list[tuple[Any, int]] = []  # (CPU base tensor, arena offset)
        self.free = 0
        self.counts: Counter | None = None  # set to a Counter: the instructions later runs issue, by opcode
        self.lands = "late"  # when TMA copies land: "late" or "early" (ptx_tma.py)
        self.order: int | None = None  # clusters launched in grid order, or in an order drawn from this seed

    def place(self, base) -> None:
        if base.data_ptr() % 64 or not base.is_contiguous():
            raise SimError("place contiguous tensors whose storage is 64-byte aligned")
        self.bases.append((base, self.free))
        self.mem.place(base, self.free)
        self.mem.allocations.append((self.free, self.free + base.numel() * base.element_size()))
        self.free += -(-base.numel() * base.element_size() // 256) * 256 + 256  # a guard gap between tensors

    def _holder(self, t) -> tuple[Any, int] | None:
        """(placed base, its arena offset) whose storage holds tensor t, or None."""
        for base, offset in self.bases:
            start = base.data_ptr()
            if start <= t.data_ptr() < start + base.numel() * base.element_size() or t.data_ptr() == start:
                return base, offset
        return None

    def address(self, t) -> int:
        holder = self._holder(t)
        if holder is None:
            raise SimError("a tensor that was not placed")
        return self.mem.base + holder[1] + t.data_ptr() - holder[0].data_ptr()

    def fetch(self, base):
        import torch
        for b, offset in self.bases:
            if b is base:
                raw = self.mem.read(self.mem.base + offset, base.numel() * base.element_size())
                return torch.from_numpy(raw).view(base.dtype).reshape(base.shape)
        raise SimError("a tensor that was not placed")

    def stores(self, base):
        """How many stores wrote each element of a placed tensor (the most of any of its bytes)."""
        import torch
        for b, offset in self.bases:
            if b is base:
                counts = self.mem.writes[offset:offset + base.numel() * base.element_size()]
                return torch.from_numpy(counts.reshape(-1, base.element_size()).max(axis=1)).reshape(base.shape)
        raise SimError("a tensor that was not placed")

    def run(self, compiled, grid: tuple[int, ...], *args, cluster: int | tuple[int, ...] = 1) -> None:
        """Launch a CompiledKernel on runtime arguments (tensors or their views, and scalars), with the TMA
        descriptors it takes encoded from them. A tensor whose storage is not placed yet is placed first (its base,
        where it is a view)."""
        import torch
        values: list = []
        for a in args:
            if isinstance(a, torch.Tensor) and not a.numel():  # torch gives an empty tensor address 0, as here
                values += [0, *a.shape, *a.stride()]
            elif isinstance(a, torch.Tensor):
                if self._holder(a) is None:
                    self.place(a if a._base is None else a._base)
                values += [self.address(a), *a.shape, *a.stride()]
            else:
                values.append(a)
        for desc in compiled.meta.get("tma", []):
            t = args[desc["param"]]
            values.append(TensorMap(self.address(t), tuple(t.shape), tuple(s * t.element_size() for s in t.stride()),
                                    tuple(desc["box"]), t.element_size(), desc["swizzle"], str(t.dtype)[6:]))
        launch(compiled.ptx, grid, values, self.mem, compiled.smem_bytes, cluster, compiled.threads, self.counts,
               self.lands, self.order)
