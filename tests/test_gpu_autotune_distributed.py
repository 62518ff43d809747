"""Two ranks on two GPUs over NCCL tune the real Hopper matmul: they split the configs, share the CUDA-event
timings and both pick the same winner (skipped where fewer than two GPUs are present)."""
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def _rank_main(rank, tmp):
    import torch.distributed as dist
    sys.path.insert(0, EXAMPLES)
    import mgjit
    from matmul_hopper import DEFAULT_CONFIG, matmul_kernel
    os.environ["MGJIT_CACHE_DIR"] = os.path.join(tmp, f"cache-rank{rank}")
    os.environ["MGJIT_AUTOTUNE_QUIET"] = "1"
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=2)
    try:
        configs = [mgjit.Config(**{**DEFAULT_CONFIG, "BN": bn, "STAGES": st})
                   for bn, st in ((256, 3), (128, 4), (128, 6), (64, 6))]
        tuned = mgjit.autotune(configs=configs, key=["a", "b"], jobs=2)(matmul_kernel)
        torch.manual_seed(0)  # the same inputs on both ranks
        a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
        c = torch.full((2048, 2048), float("nan"), device="cuda", dtype=torch.bfloat16)
        grid = lambda meta: (min(132, (2048 // meta["BM"]) * (2048 // meta["BN"])),)  # noqa: E731
        tuned[grid](a, b, c, c, c, c, c)
        err = ((c.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
        report = tuned.tuning_report()
        with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
            json.dump({"winner": report.winner.config.key(), "ms": [row.ms for row in report.rows],
                       "err": err}, f)
    finally:
        dist.destroy_process_group()


def test_two_gpus_agree_on_the_winner(tmp_path):
    torch.multiprocessing.spawn(_rank_main, args=(str(tmp_path),), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["winner"] == r1["winner"]
    assert r0["ms"] == r1["ms"] and all(ms is not None and ms > 0 for ms in r0["ms"])
    assert r0["err"] < 1e-2 and r1["err"] < 1e-2
