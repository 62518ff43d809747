"""Atomics and the matmul's stream-K fix-up as the GPU runs them: the PTX compiled for sm_90a executed on the
CPU by tests/ptx_sim.py, instruction by instruction (the interpreter does not model the lowering).

- Every atomic kind of tests/test_gpu_atomics.py against the same checks, and its cross-CTA counter (a scalar
  atomic: one thread performs it, the warpgroup gets the old value through shared memory). An array atomic
  once took every element's value from the thread's first element (the GPU's add-int32 came out in groups of
  four equal values).
- The stream-K fix-up of examples/matmul_hopper.py (its schedule, publish_partial, finish_cut_tile and
  epilogue) on GMEM blocks standing in for the wgmma's partial products, with both fix-ups, on more CTAs and
  fewer CTAs than k-iterations."""
import os
import sys

import pytest

import mgjit

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import matmul_hopper as mh  # noqa: E402
import ptx_sim  # noqa: E402
import test_gpu_atomics as ga  # noqa: E402


def simulate(kernel, grid, tensors, *args, **constexprs):
    """Compile for sm_90a, run on the simulator with `tensors` placed (passed first, in order); their contents
    afterwards."""
    compiled = kernel.compile(*tensors, *args, **constexprs, target="sm_90a")
    dev = ptx_sim.Device()
    for t in tensors:
        dev.place(t)
    dev.run(compiled, grid, *tensors, *args)
    return [dev.fetch(t) for t in tensors]


@pytest.mark.parametrize("kind,dtype", ga.KINDS, ids=lambda v: str(v).removeprefix("torch."))
def test_atomic_kinds(kind, dtype):
    x, values, old = ga.atomic_inputs(kind, dtype, 5, 512, "cpu")
    x, _, old = simulate(ga.atomic_kinds, (5,), (x, values, old), KIND=kind, BLOCK=512)
    ga.check_kind(kind, x, values, old)


def test_cross_cta_counter():
    count, tickets = torch.zeros(1, dtype=torch.int32), torch.full((9,), -1, dtype=torch.int32)
    count, tickets = simulate(ga.cross_cta_counter, (9,), (count, tickets))
    assert count.item() == 9 and torch.equal(tickets.sort().values, torch.arange(9, dtype=torch.int32))


@mgjit.kernel
def cut_tile_sums(parts, c, ws, locks, TILES: mgjit.constexpr, K_TILES: mgjit.constexpr, BN: mgjit.constexpr,
                  DETERMINISTIC: mgjit.constexpr):
    """c's 64-row tile t is the sum of the (64, BN) f32 blocks t * K_TILES .. t * K_TILES + K_TILES - 1 of parts,
    its k-iterations, shared out by the matmul's stream-K schedule and fixed up as the matmul fixes up a cut
    tile (one consumer: 64-row tiles)."""
    dp_tiles, n_dp, iters, begin, end, sk_first, items = mh.schedule(TILES, K_TILES, 1, None, 2)
    for w in range(items):
        tile, sk_tile, k0, k1 = mh.work_item(w, dp_tiles, n_dp, begin, end, sk_first, K_TILES, None, 2)
        acc = mgjit.zeros((64, BN), mgjit.float32)
        for k in range(k0, k1):
            acc = acc + parts[mgjit.ds((tile * K_TILES + k) * 64, 64), mgjit.ds(0, BN)]
        if (k0 > 0) | (k1 < K_TILES):
            if mh.publish_partial(acc, ws, locks, sk_tile, 0, K_TILES, iters, BN, 1, DETERMINISTIC, None, 2, 0):
                mh.finish_cut_tile(ws, locks, c, c, c, sk_tile, 0, tile * 64, 0, K_TILES, iters, BN, 1, DETERMINISTIC,
                                   False, False, False, None, None, 2, 0)
        else:
            mh.epilogue(acc, c, c, c, c, tile * 64, 0, 0, BN, False, False, False, None, False)


@pytest.mark.parametrize("deterministic", [True, False], ids=["ordered", "atomic"])
@pytest.mark.parametrize("tiles,k_tiles,ctas", [(3, 4, 5), (2, 3, 10)], ids=["cut", "fewer-iterations-than-ctas"])
def test_stream_k_fix_up(tiles, k_tiles, ctas, deterministic):
    bn = 32
    parts = torch.randn(tiles * k_tiles * 64, bn).to(torch.bfloat16).float()  # sums exact in f32
    c = torch.full((tiles * 64, bn), float("nan"), dtype=torch.bfloat16)
    ws = torch.zeros((tiles + ctas) * 64, bn) if not deterministic else torch.full(((tiles + ctas) * 64, bn), 7.0)
    locks = torch.zeros(tiles, dtype=torch.int32)
    _, c, ws, locks = simulate(cut_tile_sums, (ctas,), (parts, c, ws, locks), TILES=tiles, K_TILES=k_tiles, BN=bn,
                               DETERMINISTIC=deterministic)
    want = parts.view(tiles, k_tiles, 64, bn).sum(1).reshape(tiles * 64, bn)
    assert not c.isnan().any(), "a tile was never stored"
    torch.testing.assert_close(c.float(), want.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-2)
    assert not locks.any(), "every lock is reset by the CTA that finishes its tile"
    assert deterministic or not ws.any(), "the atomic fix-up zeroes the slot it added into"
