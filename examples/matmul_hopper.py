"""Hopper matmul: TMA into 128B-swizzled SMEM, an mbarrier ring, wgmma, warp specialization, a persistent grid,
and schedules for every shape: data-parallel tiles, stream-K (split-K is its special case) and swap-AB.

Each CTA loops over work items. Warpgroup 0 is the producer: it streams A and B tiles into a ring of STAGES
shared-memory slots with the TMA engine, running ahead into the next item while the consumers finish the
current one. The other warpgroups are consumers, one per 64 rows of the tile (BM = 64, 128 or 192): each multiplies
its rows of the A tile by the B tile on the tensor cores (wgmma), hands each slot back, and stores its rows of C.
Ragged edges need no code: TMA reads zeros past the tensor's end and the final store is masked.
Profiler spans (mgjit.trace) mark the producer's loads of each work item ("load tile") and each consumer's
work items ("tile"), their wgmma loop ("mma") and their epilogue or fix-up ("epilogue"); a launch records them
with profile=mgjit.Profile() (`matmul(..., profile=)`) and costs nothing without.

Schedules (examples/_matmul_schedules.py chooses one per shape, timing a few candidates once per shape):
- data-parallel (STREAM_K=0): CTA p computes whole tiles p, p + P, p + 2P, ... (P CTAs, at most one per SM);
- stream-K (STREAM_K=w >= 1): the tiles of the last partial wave and of w - 1 full waves before it are cut into
  their BK-wide k-iterations, and each CTA takes an equal, contiguous range of those iterations (with fewer
  iterations than CTAs, the first CTAs take one each). A tile cut between CTAs is fixed up by the last of them
  to finish: each contributor publishes its partial sum in a f32 workspace and counts itself in the tile's lock
  (`atomic_add(..., sem="acq_rel")`); the one that sees the count complete adds the partials and stores the
  tile. DETERMINISTIC=True (the default) gives each contributor its own slot and adds them in k order (bitwise
  repeatable); False adds them into one slot with f32 atomics. No CTA ever waits for another. Split-K is
  stream-K with P = tiles x splits CTAs.
- multicast (MULTICAST="b", or "a"; cluster=(CLUSTER, 1, 1), CLUSTER 2 or 4): the CTAs of a cluster take as many
  M-neighbour tiles (N-neighbours) and load the B (A) tile they share once, each copying a CLUSTER-th of its rows
  into every CTA's slot with TMA multicast. The slot ring spans the cluster: each consumer releases its slot in
  every CTA, so a producer refills a slot only once the consumers of all are done with it; the CTAs walk the same
  items and k-steps, an item's tiles past M or N included (read as zeros, their stores dropped). The workers of
  the schedules above are then the clusters, and their items CLUSTER tiles: with stream-K the CTAs of a cluster
  take the same k-range of their tiles and each fixes up its own.
- swap-AB (in the wrapper): C^T = B^T A^T, so that a small M becomes the N of the wgmma (8..256 in steps of 8)
  and the large N fills the 64-row side: decode shapes (M <= 64) stream the weights through every SM.

    python examples/matmul_hopper.py     # runs and checks on a Hopper GPU; compiles for sm_90a without one
"""
from __future__ import annotations

import os
import sys

import mgjit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _matmul_schedules as schedules  # noqa: E402
from _device import current_stream, kept, sm_count  # noqa: E402
from _matmul_epilogue import ACTIVATIONS, activate, empty_product  # noqa: E402
from _matmul_gemv import gemv_kmajor, gemv_nmajor  # noqa: E402

GEMV_KERNELS = {"k-major": gemv_kmajor, "n-major": gemv_nmajor}  # Plan.gemv -> its kernel


@mgjit.device
def check_ring(BM, STAGES, GROUP_M):
    """Refuse, by name, a ring (matmul_kernel's, grouped_matmul_kernel's) it cannot run as asked: a tile the
    consumers do not cover left rows of C unwritten (BM=100: rows 64-99 of every tile), one stage deadlocked (a hang
    on a GPU), GROUP_M=0 divided by zero."""
    assert BM in (64, 128, 192), f"BM is 64, 128 or 192 (each consumer warpgroup computes 64 rows), got {BM}"
    assert STAGES >= 2, f"STAGES is at least 2: a consumer gives a slot back once the next slot's wgmma is issued " \
        f"(one stays in flight), got {STAGES}"
    assert GROUP_M >= 1, f"GROUP_M (the row tiles a column sweep takes in turn) is at least 1, got {GROUP_M}"


@mgjit.device
def tile_origin(tile, tiles_m, tiles_n, BM, BN, GROUP_M):
    """Grouped order: GROUP_M row tiles share each column sweep, so B tiles are reused from L2."""
    group = tile // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    rows_in_group = mgjit.minimum(tiles_m - first_m, GROUP_M)
    within = tile % (GROUP_M * tiles_n)
    return (first_m + within % rows_in_group) * BM, (within // rows_in_group) * BN


@mgjit.device
def workers(MULTICAST, CLUSTER):
    """(this CTA's worker index, the number of workers): workers are CTAs, or with MULTICAST the clusters of
    CLUSTER CTAs, which work on the CLUSTER tiles of each work item in lockstep."""
    pid, ctas = mgjit.program_id(0), mgjit.num_programs(0)
    if MULTICAST:
        return pid // CLUSTER, ctas // CLUSTER
    return pid, ctas


@mgjit.device
def schedule(tiles, k_tiles, STREAM_K, MULTICAST, CLUSTER):
    """This worker's work: `n_dp` data-parallel tiles (pid, pid + P, ... below `dp_tiles`), then the stream-K
    tiles that its range [begin, end) of the k-iterations of the tiles from `dp_tiles` on touches. Returns
    (dp_tiles, n_dp, iters, begin, end, sk_first, items)."""
    pid, ctas = workers(MULTICAST, CLUSTER)
    dp_tiles = tiles
    iters, begin, end, sk_first, sk_count = 0, 0, 0, 0, 0
    if STREAM_K:
        # The last partial wave and STREAM_K - 1 full waves before it (none when the waves are whole).
        kept = mgjit.maximum(tiles // ctas - (STREAM_K - 1), 0) * ctas
        dp_tiles = mgjit.where(tiles % ctas == 0, tiles, kept)
        iters = (tiles - dp_tiles) * k_tiles
        count = stream_k_ctas(iters, MULTICAST, CLUSTER)  # workers p < count: each takes at least one iteration
        begin = mgjit.minimum(pid * iters // count, iters)
        end = mgjit.minimum((pid + 1) * iters // count, iters)
        sk_first = begin // k_tiles
        sk_count = mgjit.where(end > begin, (end + k_tiles - 1) // k_tiles - sk_first, 0)
    n_dp = (dp_tiles - pid + ctas - 1) // ctas
    return dp_tiles, n_dp, iters, begin, end, sk_first, n_dp + sk_count


@mgjit.device
def stream_k_ctas(iters, MULTICAST, CLUSTER):
    """How many workers share the stream-K iterations: every worker, or one per iteration when there are fewer
    (a worker with an empty range in the middle of a cut tile's contributors would never be counted in its
    lock)."""
    _, count = workers(MULTICAST, CLUSTER)
    return mgjit.minimum(count, mgjit.maximum(iters, 1))


@mgjit.device
def cut_tile(item, rank, MULTICAST, CLUSTER):
    """The index of this CTA's part of stream-K work item (or slot) `item`: the item itself, or with MULTICAST
    the rank-th of its CLUSTER tiles (each CTA of a cluster publishes and finishes its own tile)."""
    if MULTICAST:
        return item * CLUSTER + rank
    return item


@mgjit.device
def work_item(w, dp_tiles, n_dp, begin, end, sk_first, k_tiles, MULTICAST, CLUSTER):
    """Item w of this worker: (tile, its index among the stream-K tiles, first k-iteration, end k-iteration)."""
    pid, ctas = workers(MULTICAST, CLUSTER)
    dp = w < n_dp
    sk_tile = sk_first + w - n_dp
    tile = mgjit.where(dp, pid + w * ctas, dp_tiles + sk_tile)
    k0 = mgjit.where(dp, 0, mgjit.maximum(begin - sk_tile * k_tiles, 0))
    k1 = mgjit.where(dp, k_tiles, mgjit.minimum(end - sk_tile * k_tiles, k_tiles))
    return tile, sk_tile, k0, k1


@mgjit.device
def cta_tile_origin(tile, tiles_m, tiles_n, BM, BN, GROUP_M, MULTICAST, CLUSTER, rank):
    """The origin of this CTA's tile of work item `tile`: the item's own, or with MULTICAST the rank-th of its
    CLUSTER tiles, M-neighbours that share their B tile ("b") or N-neighbours that share their A tile ("a"). An
    item's last tiles may lie past M or N: TMA reads them as zeros and drops their stores."""
    m0, n0 = tile_origin(tile, tiles_m, tiles_n, BM * (CLUSTER if MULTICAST == "b" else 1),
                         BN * (CLUSTER if MULTICAST == "a" else 1), GROUP_M)
    if MULTICAST == "b":
        m0 = m0 + rank * BM
    elif MULTICAST == "a":
        n0 = n0 + rank * BN
    return m0, n0


@mgjit.device
def release(slot, MULTICAST, CLUSTER, rank):
    """Give a ring slot back to its producer, and with MULTICAST to the other CTAs' of the cluster too: their
    multicast copies write into this CTA's slot, so each waits for the consumers of every CTA. The wgmmas that
    read the slot were waited for, so the peers need no fence from us (relaxed: a release at cluster scope stalled
    every k-step on a membar and made the multicast schedule 30% slower than none)."""
    slot.arrive()
    if MULTICAST:
        for peer in mgjit.static_range(1, CLUSTER):
            slot.arrive(cta=rank ^ peer, relaxed=True)


@mgjit.device
def publish_partial(acc, ws, locks, sk_tile, half, k_tiles, iters, BN, CONSUMERS, DETERMINISTIC, MULTICAST, CLUSTER,
                    rank):
    """Publish this CTA's partial sum of its 64 rows of a cut tile and count it in the tile's lock (acq_rel:
    the partials of those counted before are visible once the count is seen). True for the contributor that
    completes the count: it finishes the tile (partial_sum). Worker p's partial of stream-K item t goes to slot
    t + p (the contributors of consecutive items never share a slot; with MULTICAST each of the cluster's
    tiles has its own, `cut_tile`), or with DETERMINISTIC=False is added into slot t with f32 atomics."""
    worker, _ = workers(MULTICAST, CLUSTER)
    slot = cut_tile(sk_tile + worker if DETERMINISTIC else sk_tile, rank, MULTICAST, CLUSTER)
    rows = mgjit.ds((slot * CONSUMERS + half) * 64, 64)
    if DETERMINISTIC:
        ws[rows, mgjit.ds(0, BN)] = acc
    else:
        mgjit.atomic_add(ws, (rows, mgjit.ds(0, BN)), acc)
    first, last = contributors(sk_tile, k_tiles, iters, MULTICAST, CLUSTER)
    lock = cut_tile(sk_tile, rank, MULTICAST, CLUSTER) * CONSUMERS + half
    return mgjit.atomic_add(locks, lock, 1, sem="acq_rel") == last - first


@mgjit.device
def contributors(sk_tile, k_tiles, iters, MULTICAST, CLUSTER):
    """The first and last worker whose iteration ranges cut stream-K item `sk_tile` (worker p < W holds
    iterations [p * iters // W, (p + 1) * iters // W), W = stream_k_ctas(iters) <= iters, so no range is empty
    and iteration i is worker ((i + 1) * W - 1) // iters's); every worker from the first to the last
    contributes."""
    count = stream_k_ctas(iters, MULTICAST, CLUSTER)
    return ((sk_tile * k_tiles + 1) * count - 1) // iters, ((sk_tile + 1) * k_tiles * count - 1) // iters


@mgjit.device
def finish_cut_tile(ws, locks, c, scale, bias, sk_tile, half, row0, n0, k_tiles, iters, BN, CONSUMERS,
                    DETERMINISTIC, SCALED, BIAS, BIAS_ROWS, ACTIVATION, MULTICAST, CLUSTER, rank):
    """Store the 64 rows of a cut tile from the published partials (added in k order with DETERMINISTIC), in
    column chunks of 64 and then the binary digits of the rest (a swapped tile's BN is M rounded up to 8: 40 as
    32 + 8; register arrays have power-of-two sides); reset the lock and the slot for the next launch."""
    for j in mgjit.static_range(BN // 64):
        finish_chunk(ws, c, scale, bias, sk_tile, half, row0, n0, j * 64, 64, k_tiles, iters, CONSUMERS,
                     DETERMINISTIC, SCALED, BIAS, BIAS_ROWS, ACTIVATION, MULTICAST, CLUSTER, rank)
    for bit in mgjit.static_range(3):
        if (BN % 64) & (32 >> bit):  # this binary digit's chunk starts after the digits above it
            finish_chunk(ws, c, scale, bias, sk_tile, half, row0, n0, BN & -(64 >> bit),
                         32 >> bit, k_tiles, iters, CONSUMERS, DETERMINISTIC, SCALED, BIAS, BIAS_ROWS, ACTIVATION,
                         MULTICAST, CLUSTER, rank)
    locks[cut_tile(sk_tile, rank, MULTICAST, CLUSTER) * CONSUMERS + half] = 0


@mgjit.device
def finish_chunk(ws, c, scale, bias, sk_tile, half, row0, n0, j0, WIDTH, k_tiles, iters, CONSUMERS, DETERMINISTIC,
                 SCALED, BIAS, BIAS_ROWS, ACTIVATION, MULTICAST, CLUSTER, rank):
    """Columns j0:j0 + WIDTH of a cut tile's 64 rows: the sum of its partials, stored. Deterministic partials
    are added to zeros in k order, LOADS at a time, each loop step's loads in flight together (one at a time, a
    swapped 64 x 40 tile of 7 contributors waited on 35 L2 round trips in turn: 5 us of a 12 us kernel); the
    loads past the last contributor read rows past the workspace's end, which read as zeros."""
    cols = mgjit.ds(j0, WIDTH)
    if DETERMINISTIC:
        # Partials in flight, WIDTH / 2 registers a thread each: 128 registers' worth beside the sum, 64 with
        # three consumers (152 registers a thread); at most 8.
        LOADS = min(8, (256 if CONSUMERS < 3 else 128) // WIDTH)
        first, last = contributors(sk_tile, k_tiles, iters, MULTICAST, CLUSTER)
        acc = mgjit.zeros((64, WIDTH), mgjit.float32)
        for p0 in range(first, last + 1, LOADS):
            for u in mgjit.static_range(LOADS):
                slot = mgjit.where(p0 + u <= last,
                                   cut_tile(sk_tile + p0 + u, rank, MULTICAST, CLUSTER) * CONSUMERS + half,
                                   mgjit.cdiv(ws.shape[0], 64))
                acc = acc + ws[mgjit.ds(slot * 64, 64), cols]
    else:
        rows = mgjit.ds((cut_tile(sk_tile, rank, MULTICAST, CLUSTER) * CONSUMERS + half) * 64, 64)
        acc = ws[rows, cols]
        ws[rows, cols] = mgjit.zeros((64, WIDTH), mgjit.float32)
    epilogue(acc, c, c, scale, bias, row0, n0 + j0, half, WIDTH, SCALED, BIAS, BIAS_ROWS, ACTIVATION, False)


@mgjit.device
def epilogue(acc, c, c_s, scale, bias, row0, n0, half, BN, SCALED, BIAS, BIAS_ROWS, ACTIVATION, TMA_STORE,
             EPILOGUE_N=64):
    """act(acc * scale + bias) into C's 64 x BN tile at (row0, n0). With TMA_STORE, a 64 x EPILOGUE_N chunk at a
    time (registers of the accumulator: no data moves) through c_s[half]'s two buffers in turn and the TMA
    engine, each store overlapping the next chunk's: two small buffers instead of a whole tile leave the slot
    ring a stage more of shared memory (128 x 256 tiles: 4 stages, not 3). Else straight from registers."""
    if TMA_STORE:
        for j in mgjit.static_range(BN // EPILOGUE_N):
            cols = mgjit.ds(n0 + j * EPILOGUE_N, EPILOGUE_N)
            chunk = scale_bias_activate(acc[:, j * EPILOGUE_N:(j + 1) * EPILOGUE_N], scale, bias, row0, cols,
                                        SCALED, BIAS, BIAS_ROWS, ACTIVATION)
            # The store that read this buffer two chunks ago is done with it; a tile's first chunk waits for every
            # store of the tile before (long done by then), whose last chunk may have used either buffer.
            mgjit.store_async_wait(0 if j == 0 else 1)
            c_s[half][j % 2][...] = chunk.astype(c.dtype)
            mgjit.store_async(c, (row0, n0 + j * EPILOGUE_N), c_s[half][j % 2])
    else:
        acc = scale_bias_activate(acc, scale, bias, row0, mgjit.ds(n0, BN), SCALED, BIAS, BIAS_ROWS, ACTIVATION)
        c[mgjit.ds(row0, 64), mgjit.ds(n0, BN)] = acc.astype(c.dtype)


@mgjit.device
def scale_bias_activate(acc, scale, bias, row0, cols, SCALED, BIAS, BIAS_ROWS, ACTIVATION):
    """act(acc * scale + bias) of C's 64 rows from row0 and its columns `cols` (a window, mgjit.ds)."""
    if SCALED:
        acc = acc * scale[0]
    if BIAS:
        if BIAS_ROWS:
            acc = acc + bias[mgjit.ds(row0, 64)].astype(mgjit.float32)[:, None]
        else:
            acc = acc + bias[cols].astype(mgjit.float32)
    return activate(acc, ACTIVATION)


@mgjit.kernel(num_warpgroups=3)
def matmul_kernel(a, b, c, scale, bias, ws, locks, BM: mgjit.constexpr, BN: mgjit.constexpr, BK: mgjit.constexpr,
                  STAGES: mgjit.constexpr, GROUP_M: mgjit.constexpr, B_KMAJOR: mgjit.constexpr = False,
                  A_MNMAJOR: mgjit.constexpr = False, SCALED: mgjit.constexpr = False, BIAS: mgjit.constexpr = False,
                  BIAS_ROWS: mgjit.constexpr = False, ACTIVATION: mgjit.constexpr = None,
                  TMA_STORE: mgjit.constexpr = True, STREAM_K: mgjit.constexpr = 0,
                  DETERMINISTIC: mgjit.constexpr = True, MULTICAST: mgjit.constexpr = None,
                  EPILOGUE_N: mgjit.constexpr = 64, CLUSTER: mgjit.constexpr = 2):
    """c = act(a @ b * scale[0] + bias): a is (M, K), or (K, M) when A_MNMAJOR; b is (K, N), or (N, K) when
    B_KMAJOR (fp8 and tf32 need both K-major). scale, bias (per column, or per row with BIAS_ROWS) and the
    activation are optional and applied to the f32 accumulator on the way out. Launch with BM // 64 + 1
    warpgroups. ws (f32) and locks (int32, zeros) serve stream-K's fix-up (examples/_matmul_schedules.py
    sizes them); other schedules never touch them. MULTICAST="b" (or "a"), launched with cluster=(CLUSTER, 1, 1):
    the CLUSTER (2 or 4) CTAs of a cluster take as many M-neighbour tiles that share their B tile (or N-neighbours
    sharing A), each copying a CLUSTER-th of the shared tile into every CTA's slot (TMA multicast), data-parallel
    or stream-K. With TMA_STORE, C leaves in 64 x EPILOGUE_N chunks (a divisor of BN:
    examples/_matmul_schedules.epilogue_n)."""
    # Configs the kernel cannot run as asked, refused by name (`check_ring`; a tile row no swizzle row holds failed
    # deep in the SMEM allocation)
    check_ring(BM, STAGES, GROUP_M)
    assert BN % 8 == 0 and 8 <= BN <= 256, f"BN is a multiple of 8 from 8 to 256 (wgmma's N), got {BN}"
    assert B_KMAJOR or BN * b.dtype.itemsize == 32 or BN * b.dtype.itemsize % 64 == 0, \
        f"an N-major B tile's rows ({BN} columns) fill 32-, 64- or 128-byte swizzle rows: BN a multiple of 32, or " \
        f"16, got {BN}"
    assert MULTICAST in (None, "a", "b"), "MULTICAST is None, or the operand a cluster's CTAs share: a or b"
    assert CLUSTER in (2, 4), "CLUSTER, the CTAs of a multicast cluster, is 2 or 4"
    assert not TMA_STORE or BN % EPILOGUE_N == 0, "with TMA_STORE, EPILOGUE_N (the columns of each epilogue chunk, " \
        "64 unless given) must divide BN"
    assert not TMA_STORE or EPILOGUE_N * c.dtype.itemsize in (32, 64) or EPILOGUE_N * c.dtype.itemsize % 128 == 0, \
        f"with TMA_STORE, an epilogue chunk's rows (EPILOGUE_N = {EPILOGUE_N} columns) fill a 32-, 64- or 128-byte " \
        f"swizzle row (TMA_STORE=False: stores from registers)"
    CONSUMERS = BM // 64
    # Work items: tiles, or with MULTICAST CLUSTER neighbour tiles (CLUSTER BM x BN sharing B, BM x CLUSTER BN
    # sharing A).
    tiles_m = mgjit.cdiv(a.shape[1] if A_MNMAJOR else a.shape[0], BM * (CLUSTER if MULTICAST == "b" else 1))
    tiles_n = mgjit.cdiv(b.shape[0] if B_KMAJOR else b.shape[1], BN * (CLUSTER if MULTICAST == "a" else 1))
    k_tiles = mgjit.cdiv(a.shape[0] if A_MNMAJOR else a.shape[1], BK)
    dp_tiles, n_dp, iters, begin, end, sk_first, items = schedule(tiles_m * tiles_n, k_tiles, STREAM_K, MULTICAST,
                                                                      CLUSTER)

    a_s = mgjit.smem((STAGES, CONSUMERS, BK, 64) if A_MNMAJOR else (STAGES, CONSUMERS, 64, BK), a.dtype, swizzle=128)
    # An N-major B tile's rows are BN wide (an odd multiple of 32 columns of 16 bits: 64B swizzle rows), an epilogue
    # chunk's EPILOGUE_N (32 columns: the same).
    b_s = mgjit.smem((STAGES, BN, BK) if B_KMAJOR else (STAGES, BK, BN), b.dtype,
                     swizzle=128 if B_KMAJOR or BN * b.dtype.itemsize % 128 == 0 else
                     64 if BN * b.dtype.itemsize % 64 == 0 else 32)
    c_s = c  # each consumer's two epilogue buffers (chunks of its rows of the tile, in turn), with TMA_STORE
    if TMA_STORE:
        c_s = mgjit.smem((CONSUMERS, 2, 64, EPILOGUE_N), c.dtype, swizzle=min(128, EPILOGUE_N * c.dtype.itemsize))
    full = mgjit.barrier(STAGES, arrivals=CONSUMERS + 1)  # the A parts and B fill a slot
    # Every consumer releases it; with MULTICAST those of every CTA (the peers' copies write into this slot too).
    empty = mgjit.barrier(STAGES, arrivals=CONSUMERS * (CLUSTER if MULTICAST else 1))
    rank = 0  # this CTA's tile of a MULTICAST work item
    if MULTICAST:
        rank = mgjit.cluster_rank()
        mgjit.cluster_sync()  # the peer's barriers are initialised before any multicast copy signals them

    wg = mgjit.warpgroup_id()
    it = 0  # position in the slot ring, continued across work items
    if wg == 0:
        if CONSUMERS > 1:  # the warpgroups share the register file: the producer needs few
            mgjit.set_max_registers(40, increase=False)
        for w in range(items):
            tile, sk_tile, k0, k1 = work_item(w, dp_tiles, n_dp, begin, end, sk_first, k_tiles, MULTICAST, CLUSTER)
            m0, n0 = cta_tile_origin(tile, tiles_m, tiles_n, BM, BN, GROUP_M, MULTICAST, CLUSTER, rank)
            with mgjit.trace("load tile"):  # spans: recorded when a launch profiles (profile=mgjit.Profile())
                for k in range(k0, k1):
                    slot = it % STAGES
                    if it >= STAGES:
                        empty[slot].wait()
                    for h in mgjit.static_range(CONSUMERS):
                        mgjit.copy_async(a, (k * BK, m0 + h * 64) if A_MNMAJOR else (m0 + h * 64, k * BK),
                                         a_s[slot][h], barrier=full[slot], multicast=MULTICAST == "a")
                    mgjit.copy_async(b, (n0, k * BK) if B_KMAJOR else (k * BK, n0), b_s[slot], barrier=full[slot],
                                     multicast=MULTICAST == "b")
                    it += 1
    else:
        if CONSUMERS > 1:  # 40 + 2 x 232 or 40 + 3 x 152 registers a thread fill its 512
            mgjit.set_max_registers(232 if CONSUMERS == 2 else 152, increase=True)
        half = wg - 1
        for w in range(items):
            with mgjit.trace("tile"):  # one work item: a whole tile, or a stream-K range of one
                tile, sk_tile, k0, k1 = work_item(w, dp_tiles, n_dp, begin, end, sk_first, k_tiles, MULTICAST,
                                                  CLUSTER)
                m0, n0 = cta_tile_origin(tile, tiles_m, tiles_n, BM, BN, GROUP_M, MULTICAST, CLUSTER, rank)
                acc = mgjit.zeros((64, BN), mgjit.float32)
                with mgjit.trace("mma"):
                    for k in range(k0, k1):
                        slot = it % STAGES
                        full[slot].wait()
                        acc = mgjit.wgmma(acc, a_s[slot][half].T if A_MNMAJOR else a_s[slot][half],
                                          b_s[slot].T if B_KMAJOR else b_s[slot])
                        mgjit.wgmma_wait(1)  # the previous slot's wgmma is done: give that slot back
                        if k > k0:
                            release(empty[(it - 1) % STAGES], MULTICAST, CLUSTER, rank)
                        it += 1
                    mgjit.wgmma_wait(0)
                release(empty[(it - 1) % STAGES], MULTICAST, CLUSTER, rank)
                row0 = m0 + half * 64
                with mgjit.trace("epilogue"):  # or a cut tile's fix-up
                    if STREAM_K:
                        if (k0 > 0) | (k1 < k_tiles):  # a cut tile: the last contributor to finish stores it
                            if publish_partial(acc, ws, locks, sk_tile, half, k_tiles, iters, BN, CONSUMERS,
                                               DETERMINISTIC, MULTICAST, CLUSTER, rank):
                                finish_cut_tile(ws, locks, c, scale, bias, sk_tile, half, row0, n0, k_tiles, iters,
                                                BN, CONSUMERS, DETERMINISTIC, SCALED, BIAS, BIAS_ROWS, ACTIVATION,
                                                MULTICAST, CLUSTER, rank)
                        else:
                            epilogue(acc, c, c_s, scale, bias, row0, n0, half, BN, SCALED, BIAS, BIAS_ROWS,
                                     ACTIVATION, TMA_STORE, EPILOGUE_N)
                    else:
                        epilogue(acc, c, c_s, scale, bias, row0, n0, half, BN, SCALED, BIAS, BIAS_ROWS, ACTIVATION,
                                 TMA_STORE, EPILOGUE_N)
        mgjit.store_async_wait(0)
    if MULTICAST:  # no CTA exits while a peer may still copy into its slots or arrive on its barriers
        mgjit.cluster_sync()


DEFAULT_CONFIG = dict(BM=128, BN=256, BK=64, STAGES=3, GROUP_M=8)
BK_FOR_BITS = schedules.BK_FOR_BITS


def _tma_aligned(t) -> bool:
    """Whether TMA can read t as it is: unit column stride, rows and address 16-byte aligned."""
    return t.stride(-1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0


def _padded(rows: int, cols: int, dtype, device):
    """An unfilled (rows, cols) view of a tensor whose rows are padded to 16 bytes, as TMA needs. The descriptors
    take the view's sizes (runtime.TensorMaps), so TMA neither reads nor writes the padding: a fill would cost a
    kernel a call (777x1234x4096 on an H200: two fills, 2.7 us each, and 12 us of the call's CPU time)."""
    import torch
    padded = -(-cols * dtype.itemsize // 16) * 16 // dtype.itemsize
    t = torch.empty(rows, padded, dtype=dtype, device=device)
    return t if padded == cols else t[:, :cols]


def _tma_ready(t):
    """TMA needs 16-byte aligned rows: a tensor whose rows are not is copied into (a view of) one padded to 16."""
    if _tma_aligned(t):
        return t
    ready = _padded(t.shape[0], t.shape[1], t.dtype, t.device)
    if not t.is_cuda:
        return ready.copy_(t)
    copy_window[(-(-t.shape[0] // COPY_ROWS), -(-t.shape[1] // COPY_COLUMNS))](t, ready, ROWS=COPY_ROWS,
                                                                             COLS=COPY_COLUMNS)
    return ready


# A padded copy's window. torch copies into padded rows element by element: B of 777x1234x4096 (4096 rows of
# 1234 bf16) took 17.6 us on an H200, 12.3 us as 32-bit words, 10.4 us in these windows, where a contiguous clone
# takes 9.5 (do_bench medians). Windows of 8x512, 32x128, 4x1024, 32x256, 16x512, 64x128 ran within 0.1-0.8 us of
# them over rows of 1234 (4096 and 8192 rows), 1233 and 14336 of 4099 (scratch timings, thirty-eighth session).
COPY_ROWS, COPY_COLUMNS = 16, 256


@mgjit.kernel
def copy_window(x, out, ROWS: mgjit.constexpr, COLS: mgjit.constexpr):
    """out[w] = x[w] for one (ROWS, COLS) window w of two 2D tensors of one shape and dtype: rows that start
    anywhere in a 32-bit word move as aligned words, shifted into place (ops/gmem.py)."""
    w = (mgjit.ds(mgjit.program_id(0) * ROWS, ROWS), mgjit.ds(mgjit.program_id(1) * COLS, COLS))
    out[w] = x[w]


def _output(m: int, n: int, dtype, device):
    """An output for the kernel: rows padded to 16 bytes, as TMA stores need."""
    return _padded(m, n, dtype, device)


# What `matmul` decided for each call key (_call_key): a call with a key seen before launches from here.
_PREPARED: dict[tuple, "_Prepared"] = {}


def matmul(a, b, config: dict | None = None, *, scale=None, bias=None, activation: str | None = None,
           out_dtype=None, b_kmajor: bool = False, profile=None):
    """act(a @ b * scale + bias) for 2D CUDA tensors with fp32 accumulation (an a of more dimensions: its leading
    ones flattened into rows, a view where its strides allow one, as torch.matmul with a 2D b): bf16/f16 (either
    operand may be a transposed or strided view); fp8 e4m3/e5m2 and f32 (as tf32) with b given (N, K) and
    b_kmajor=True.
    `scale` is a 1-element f32 tensor, `bias` an (N,) tensor, `activation` None, "relu" or "gelu". `config`
    fixes the schedule and tile (keys of matmul_kernel's constexprs, plus SWAP_AB); without one, heuristics
    propose a few per shape and the fastest is timed once and remembered (examples/_matmul_schedules.py).
    `profile`, an mgjit.Profile, records the spans of the launch that computes c (not of the timed ones).
    A call like an earlier one (shapes, strides, dtypes, alignment, device, stream, epilogue: `_call_key`)
    launches what that one decided, with only its per-call work (`_Prepared`)."""
    import torch
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if a.dim() > 2 and b.dim() == 2:  # (..., M, K) @ (K, N), as torch.matmul: a's leading dimensions are rows too
        c = matmul(a.reshape(-1, a.shape[-1]), b, config, scale=scale, bias=bias, activation=activation,
                   out_dtype=out_dtype, b_kmajor=b_kmajor, profile=profile)
        return c.view(*a.shape[:-1], c.shape[1])
    key = None
    if config is None and profile is None:
        key = _call_key(a, b, scale, bias, activation, out_dtype, b_kmajor)
        prepared = _PREPARED.get(key)
        if prepared is not None and prepared.chosen is schedules._CHOSEN and prepared.sms == sm_count(
                key[-1].index):
            return prepared(a, b, scale, bias)
    k_b = b.shape[1] if b_kmajor else b.shape[0]
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != k_b:
        raise ValueError(f"matmul needs (M, K) @ (K, N) (or (N, K) with b_kmajor), got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul takes two tensors of one dtype, got {a.dtype} and {b.dtype}")
    schedules.check_operands("matmul", a=a)
    if b.device != a.device:
        raise ValueError(f"matmul takes a and b on one device, got {a.device} and {b.device}")
    bits = a.element_size() * 8
    out_dtype = out_dtype or (a.dtype if bits == 16 else torch.bfloat16)
    problem = schedules.Problem.of(a, b, b_kmajor, out_dtype, scale is not None, bias is not None, activation)
    if bits != 16 and not problem.b_k:
        raise ValueError(f"{a.dtype} operands must be K-major: pass b as (N, K) with b_kmajor=True (or b as a "
                         f"transposed view of one)")
    if not (problem.m and problem.n and problem.k):
        return empty_product(problem.m, problem.n, out_dtype, scale, bias, activation, a.device)
    sms = sm_count(a.device.index)
    cfg = schedules.choose(problem, config, sms, lambda candidate, c: _launch(problem, candidate, c, scale, bias),
                           matmul_kernel, lambda: _output(problem.m, problem.n, out_dtype, a.device))
    c = _output(problem.m, problem.n, out_dtype, a.device)
    plan = _launch(problem, cfg, c, scale, bias, profile)
    if key is not None:
        _PREPARED[key] = _Prepared(problem, plan, a, b, b_kmajor, sms)
    return c


def _call_key(a, b, scale, bias, activation, out_dtype, b_kmajor) -> tuple:
    """What the wrapper's decisions for a call depend on: the operands' shapes, strides, dtypes and alignment
    (views, copies, padding, the schedule), devices and stream (the SM count, the stream-K workspace), the
    output dtype and the epilogue. The kernel's own dispatch checks every argument it is given (scale's and
    bias's dtype, shape, strides and alignment among them). The device comes last."""
    device = a.device
    return (a.shape, a.stride(), a.dtype, a.data_ptr() % 16, b.shape, b.stride(), b.dtype, b.data_ptr() % 16,
            b.device, current_stream(device), out_dtype, b_kmajor, scale is None, bias is None,
            activation, device)


class _Prepared:
    """One call key's launch, as `matmul` decided it: a later call with the key makes only its per-call parts
    (its operands' views, or their copies where the first call needed copies, its output and the workspace
    for its stream) and launches, through the kernel's dispatch (which checks every argument again)."""

    def __init__(self, problem: schedules.Problem, plan: schedules.Plan, a, b, b_kmajor: bool, sms: int):
        self.chosen = schedules._CHOSEN  # the table the schedule came from (a replaced one chooses again)
        self.sms = sms
        a_t, b_t = schedules.transposed_views(a, b, b_kmajor)
        # Views where both operands are read as given (or transposed) and TMA can read them as they are; else
        # the operands are made as on the first call (a contiguous copy, rows padded for TMA).
        self.views = (a_t or a.stride(1) == 1) and (b_t or b.stride(1) == 1) and _tma_aligned(problem.a_op) \
            and _tma_aligned(problem.b_op)
        self.a_t, self.b_t = a_t, b_t
        self.m, self.n, self.out_dtype = problem.m, problem.n, problem.out_dtype
        self.swap, self.plan, self.gemv = plan.swap, plan, plan.gemv
        kernel = GEMV_KERNELS[plan.gemv] if plan.gemv else matmul_kernel
        self.launch = kernel[plan.grid]
        kernel_cfg = {**kernel.defaults, **plan.kernel_cfg}
        self.constexprs = tuple(kernel_cfg[n] for n in kernel.constexpr_names)
        self.warpgroups, self.cluster = kernel_cfg.get("num_warpgroups", 1), kernel_cfg.get("cluster")
        # Stream-K's workspace, or a split GEMV's: this key's stream's, as `launch_workspace` made it last (it is
        # replaced when it grows).
        self.workspace_key = schedules.workspace_key(plan.kernel_cfg, a.device) \
            if plan.kernel_cfg.get("STREAM_K") or plan.kernel_cfg.get("SPLIT", 1) > 1 else None
        self.workspace = None

    def __call__(self, a, b, scale, bias):
        if self.gemv:  # a as given; the weights (N, K) or (K, N), as the GEMV reads them
            c = _output(self.m, self.n, self.out_dtype, a.device)
            workspace = () if self.gemv == "k-major" else self._workspace(c)
            self.launch(a, b.t() if self.b_t else b, c, scale if scale is not None else c,
                        bias if bias is not None else c, *workspace, *self.constexprs)
            return c
        if self.views:
            a_op, b_op = a.t() if self.a_t else a, b.t() if self.b_t else b
        else:
            a_op = _tma_ready(schedules.operand(a, self.a_t))
            b_op = _tma_ready(schedules.operand(b, self.b_t))
        c = _output(self.m, self.n, self.out_dtype, a.device)
        a_k, b_k, c_k = (b_op, a_op, c.t()) if self.swap else (a_op, b_op, c)
        self.launch(a_k, b_k, c_k, scale if scale is not None else c, bias if bias is not None else c,
                    *self._workspace(c), *self.constexprs, num_warpgroups=self.warpgroups, cluster=self.cluster)
        return c

    def _workspace(self, c) -> tuple:
        if self.workspace_key is None:
            return c, c
        if self.workspace is None or kept(self.workspace_key) is not self.workspace:
            self.workspace = schedules.launch_workspace(self.plan, c)
        return self.workspace


def _launch(problem: schedules.Problem, cfg: dict, c, scale, bias, profile=None) -> schedules.Plan:
    """One launch of matmul_kernel for `problem` with `cfg`, writing c (recording its spans in `profile`)."""
    plan = schedules.launch_plan(problem, cfg, sm_count(c.device.index))
    if plan.gemv:
        a = problem.a_op.t() if problem.a_mn else problem.a_op
        GEMV_KERNELS[plan.gemv][plan.grid](a, problem.b_op, c, scale if scale is not None else c,
                                           bias if bias is not None else c, *schedules.launch_workspace(plan, c),
                                           **plan.kernel_cfg, **({} if profile is None else {"profile": profile}))
        return plan
    matmul_kernel[plan.grid](*kernel_args(problem, plan, c, scale, bias), **plan.kernel_cfg,
                             **({} if profile is None else {"profile": profile}))  # profiled: the Python path
    return plan


def kernel_args(problem: schedules.Problem, plan: schedules.Plan, c, scale, bias) -> tuple:
    """matmul_kernel's runtime arguments for a (non-GEMV) `plan`: A and B as TMA reads them (exchanged under
    swap-AB, which writes C transposed), scale and bias (c where absent: not read), the stream-K workspace."""
    a, b = _tma_ready(problem.a_op), _tma_ready(problem.b_op)
    a, b, c_arg = (b, a, c.t()) if plan.swap else (a, b, c)
    return (a, b, c_arg, scale if scale is not None else c, bias if bias is not None else c,
            *schedules.workspace(plan.kernel_cfg, plan.tiles, plan.grid, c))


def _matmul_outputs(a, b, scale=None, bias=None, activation=None, b_kmajor=False):
    import torch
    return (a.shape[0], b.shape[0] if b_kmajor else b.shape[1]), a.dtype if a.element_size() == 2 else torch.bfloat16


# matmul (its chosen schedule, default output dtype) as a torch custom op: torch.compile keeps it as one node.
matmul_op = mgjit.torch_op("mgjit_examples::matmul", outputs=_matmul_outputs, params={
    "a": "Tensor", "b": "Tensor", "scale": "Optional[Tensor]", "bias": "Optional[Tensor]",
    "activation": "Optional[str]", "b_kmajor": bool})(matmul)


if __name__ == "__main__":
    import torch
    if torch.cuda.is_available():
        failed = False
        for m, n, k in [(4096, 4096, 4096), (3, 4096, 4096), (1000, 3000, 2000), (256, 256, 16384)]:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
            c = matmul(a, b)
            err = ((c.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
            print(f"matmul {m}x{n}x{k} bf16: relative error {err:.2e}, schedule {schedules.chosen(a, b)}")
            failed |= not err < 1e-2
        raise SystemExit(1 if failed else 0)
    x = torch.empty(4096, 4096, dtype=torch.bfloat16)
    print(matmul_kernel.compile(x, x, x, x, x, x, x, **DEFAULT_CONFIG, target="sm_90a"))
