"""A small model built from mgjit kernels (issue 13): layers of linear (the Hopper matmul with its bias and GELU
fused) then RMSNorm plus a residual, each an mgjit custom op (examples/*: matmul_op, rmsnorm_op), timed eager,
under torch.compile(fullgraph=True), and replayed as a CUDA graph, against the same model in plain torch
(cuBLAS linear + GELU + rms_norm) run the same three ways, in one process.

    python benchmarks/model.py [--json out.json]

Two sizes: a small batch where launch overhead dominates, and a large one where the kernels do. Times are
triton.testing.do_bench medians of a forward pass on rotating inputs; every variant is checked against the
plain torch model first.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
sys.path.insert(0, EXAMPLES)
LAYERS = 4
SIZES = ((64, 1024), (8192, 4096))  # (tokens, width)


def example(name):
    """An examples/ module, loaded under a name of its own."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Layer(torch.nn.Module):
    def __init__(self, width: int, mgjit_ops: dict | None):
        super().__init__()
        self.ops = mgjit_ops
        self.w = torch.nn.Parameter(torch.randn(width, width, device="cuda", dtype=torch.bfloat16) / width ** 0.5)
        self.b = torch.nn.Parameter(torch.randn(width, device="cuda", dtype=torch.bfloat16) * 0.1)
        self.g = torch.nn.Parameter(torch.ones(width, device="cuda", dtype=torch.bfloat16))

    def forward(self, x):
        if self.ops is None:  # plain torch: cuBLAS (weight as (in, out), like the mgjit matmul's b)
            h = torch.nn.functional.gelu(torch.addmm(self.b, x, self.w))
            return torch.nn.functional.rms_norm(h, (h.shape[-1],), self.g, 1e-6) + x
        h = self.ops["matmul"].matmul_op(x, self.w, None, self.b, "gelu")
        return self.ops["rmsnorm"].rmsnorm_op(h, self.g, 1e-6) + x


def model(width: int, ops: dict | None, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[Layer(width, ops) for _ in range(LAYERS)]).eval()


def graphed(fn, example):
    """fn replayed as one CUDA graph: copy the input into the static one, replay, return the static output."""
    static_in = example.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(static_in)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(static_in)

    def run(x):
        static_in.copy_(x)
        graph.replay()
        return static_out
    return run


def main() -> None:
    from triton.testing import do_bench
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    ops = {"matmul": example("matmul_hopper"), "rmsnorm": example("rmsnorm")}
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    print(f"device: {results['device']}, torch {results['torch']}; {LAYERS} layers of linear+GELU, RMSNorm, "
          "residual; median ms per forward")
    print(f"{'tokens x width':<16} {'variant':<18} {'mgjit ms':>9} {'torch ms':>9} {'mgjit/torch':>12}")
    with torch.no_grad():
        for tokens, width in SIZES:
            inputs = [torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
            models = {"mgjit": model(width, ops), "torch": model(width, None)}
            runs = {}
            for who, m in models.items():
                runs[(who, "eager")] = m
                runs[(who, "torch.compile")] = torch.compile(m, fullgraph=True)
                runs[(who, "compile+cudagraphs")] = torch.compile(m, fullgraph=True, mode="reduce-overhead")
                runs[(who, "cuda graph")] = graphed(m, inputs[0])
            reference = models["torch"](inputs[1]).float()
            for key, fn in runs.items():
                for x in inputs[:3]:
                    fn(x)  # warm-up (compiles, records graphs)
                err = ((fn(inputs[1]).float() - reference).norm() / reference.norm()).item()
                assert err < 3e-2, f"{key}: relative error {err:.3g} against the torch model"
            for variant in ("eager", "torch.compile", "compile+cudagraphs", "cuda graph"):
                ms = {}
                for who in ("mgjit", "torch"):  # interleaved: mgjit then torch for each variant
                    fn, it = runs[(who, variant)], iter(range(1 << 30))
                    ms[who] = do_bench(lambda: fn(inputs[next(it) % len(inputs)]), warmup=25, rep=200,
                                       return_mode="median")
                results[f"{tokens}x{width}_{variant}"] = ms
                print(f"{f'{tokens}x{width}':<16} {variant:<18} {ms['mgjit']:9.3f} {ms['torch']:9.3f} "
                      f"{ms['mgjit'] / ms['torch']:12.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
