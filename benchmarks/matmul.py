"""Hopper matmul: mgjit against torch.matmul (cuBLAS) and an autotuned Triton matmul, in one process, on
the same random bf16 inputs; prints TFLOP/s and ratios (and checks each result first).

    python benchmarks/matmul.py [--shapes 8192x8192x8192 ...] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from matmul_hopper import DEFAULT_CONFIG, matmul  # noqa: E402

SHAPES = ["8192x8192x8192", "4096x4096x4096", "16384x8192x1024", "128x8192x8192", "1000x3000x2000"]
CONFIGS = [DEFAULT_CONFIG, {**DEFAULT_CONFIG, "TMA_STORE": False, "STAGES": 4},
           {**DEFAULT_CONFIG, "BN": 128, "STAGES": 4}, {**DEFAULT_CONFIG, "BN": 128, "STAGES": 6, "TMA_STORE": False},
           {**DEFAULT_CONFIG, "BN": 64, "STAGES": 6}]


# (BM, BN, BK, GROUP_M, num_stages, num_warps): the Triton matmul's own tuned configs.
TRITON_POINTS = [(128, 256, 64, 8, 3, 8), (128, 128, 64, 8, 4, 4), (64, 256, 64, 8, 4, 4), (128, 256, 64, 8, 4, 8),
                 (256, 128, 64, 8, 3, 8), (128, 128, 128, 8, 3, 8)]


def triton_matmul(points=TRITON_POINTS):
    """A tutorial-style Triton matmul autotuned over `points`; returns run(x, y, out)."""
    import triton
    import triton.language as tl

    configs = [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": g}, num_stages=s, num_warps=w)
               for bm, bn, bk, g, s, w in points]

    @triton.autotune(configs=configs, key=["M", "N", "K"])
    @triton.jit
    def kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, GROUP_M: tl.constexpr):
        pid = tl.program_id(0)
        num_m, num_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
        group = pid // (GROUP_M * num_n)
        first_m = group * GROUP_M
        size_m = min(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % (GROUP_M * num_n)) % size_m
        pid_n = (pid % (GROUP_M * num_n)) // size_m
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            kk = k * BK + rk
            x = tl.load(a + rm[:, None] * sam + kk[None, :] * sak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            y = tl.load(b + kk[:, None] * sbk + rn[None, :] * sbn, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(x, y, acc)
        tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

    def run(x, y, out):
        M, K = x.shape
        N = y.shape[1]
        grid = lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)
        kernel[grid](x, y, out, M, N, K, x.stride(0), x.stride(1), y.stride(0), y.stride(1), out.stride(0),
                     out.stride(1))
        return out
    return run


def bench(fn) -> float:
    from triton.testing import do_bench
    return do_bench(fn, warmup=100, rep=500, return_mode="median")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=SHAPES)
    ap.add_argument("--json")
    ap.add_argument("--no-triton", action="store_true")
    args = ap.parse_args()
    tmm = None if args.no_triton else triton_matmul()
    rows, results = [], {"device": torch.cuda.get_device_name(), "shapes": {}}
    for shape in args.shapes:
        m, n, k = map(int, shape.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ b.float()
        flops = 2 * m * n * k
        out = {}
        best = None
        for cfg in CONFIGS:
            c = matmul(a, b, cfg)
            err = ((c.float() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                print(f"{shape} {cfg}: WRONG, relative error {err}")
                continue
            t = bench(lambda: matmul(a, b, cfg))
            if best is None or t < best[0]:
                best = (t, cfg)
        out["mgjit"] = best[0] if best else math.nan
        out["cublas"] = bench(lambda: torch.matmul(a, b))
        if tmm:
            c3 = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            tmm(a, b, c3)
            out["triton"] = bench(lambda: tmm(a, b, c3))
        tf = {who: flops / t / 1e9 for who, t in out.items()}
        results["shapes"][shape] = {"ms": out, "tflops": tf, "config": best[1] if best else None}
        rows.append((shape, tf, best[1] if best else None))
        del a, b, ref
    # fp8 e4m3 8192^3 against torch._scaled_mm, B K-major (as _scaled_mm wants it), per-tensor scales.
    m = n = k = 8192
    a8 = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    w8 = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([0.5], device="cuda")
    sab = sa * sb
    fp8_cfg = {"BK": 128}
    c8 = matmul(a8, w8, fp8_cfg, scale=sab, b_kmajor=True)
    theirs = torch._scaled_mm(a8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    err8 = ((c8.float() - theirs.float()).norm() / theirs.float().norm()).item()
    t_m = bench(lambda: matmul(a8, w8, fp8_cfg, scale=sab, b_kmajor=True))
    t_t = bench(lambda: torch._scaled_mm(a8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
    fl = 2 * m * n * k
    results["fp8_8192"] = {"mgjit_tflops": fl / t_m / 1e9, "scaled_mm_tflops": fl / t_t / 1e9, "rel_err": err8}
    print(f"device: {results['device']}")
    print(f"fp8 e4m3 8192^3: mgjit {fl / t_m / 1e9:.1f} TFLOP/s, torch._scaled_mm {fl / t_t / 1e9:.1f}, "
          f"ratio {t_t / t_m:.3f} (rel. difference {err8:.1e})")
    for shape, tf, cfg in rows:
        line = f"{shape:>18}  mgjit {tf['mgjit']:7.1f}  cuBLAS {tf['cublas']:7.1f}"
        line += f"  triton {tf['triton']:7.1f}" if "triton" in tf else ""
        line += f"  mgjit/cuBLAS {tf['mgjit'] / tf['cublas']:.3f}"
        line += f"  mgjit/triton {tf['mgjit'] / tf['triton']:.3f}" if "triton" in tf else ""
        print(line + f"  cfg {cfg}")
    ratios = [tf["mgjit"] / tf["cublas"] for _, tf, _ in rows if tf["mgjit"] == tf["mgjit"]]
    if ratios:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        results["geomean_vs_cublas"] = geo
        print(f"geomean mgjit/cuBLAS over {len(ratios)} shapes: {geo:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
