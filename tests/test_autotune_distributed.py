"""Two CPU ranks over gloo split the configs, share timings and pick one winner, even when their timers
disagree and their on-disk stores hold different results."""
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing
from mgjit.autotune import Config, Result, ResultStore, autotune
from mgjit.autotune.distributed import my_share
from test_autotune_fakes import FakeKernel, FakeTimer

CONFIGS = [Config(BM=bm, BN=bn, BK=64, STAGES=2, num_warpgroups=wg)
           for bm in (64, 128) for bn in (64, 128, 256) for wg in (1, 2)]
BASE = {c: 1.0 + 0.25 * i for i, c in enumerate(CONFIGS)}


def rank_times(rank):
    # Rank 0 finds config 0 fastest, rank 1 finds the last config fastest: timed alone, they would disagree.
    return (lambda c: BASE[c]) if rank == 0 else (lambda c: 10.0 - BASE[c])


def _rank_main(rank, tmp):
    os.environ["MGJIT_CACHE_DIR"] = os.path.join(tmp, f"cache-rank{rank}")  # as if on separate machines
    os.environ["MGJIT_AUTOTUNE_QUIET"] = "1"
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=2)
    try:
        kernel = FakeKernel(os.path.join(tmp, f"kernels-rank{rank}"))
        timer = FakeTimer(kernel, rank_times(rank))
        matmul = autotune(configs=CONFIGS, key=["M", "N", "K"], timer=timer, jobs=1)(kernel)
        a = torch.ones(128, 64)

        matmul[(1,)](a, a, a, 128, 128, 64)
        first = matmul.tuning_report()
        timed_first = [c.key() for c in timer.timed]

        # Key two: only rank 0's store knows configs 0-3, with config 2 fastest of all.
        if rank == 0:
            ResultStore(os.path.join(tmp, "cache-rank0", "autotune")).save(
                kernel.name, kernel.source_key(), timer.device, matmul.tuning_key(
                    dict(a=a, b=a, c=a, M=256, N=128, K=64)),
                {c.key(): Result(ms=0.01 if i == 2 else 50.0) for i, c in enumerate(CONFIGS[:4])})
        dist.barrier()
        matmul[(1,)](a, a, a, 256, 128, 64)
        second = matmul.tuning_report()
        with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
            json.dump({"winner1": first.winner.config.key(), "winner2": second.winner.config.key(),
                       "ms1": [row.ms for row in first.rows], "ms2": [row.ms for row in second.rows],
                       "timed1": timed_first, "timed2": [c.key() for c in timer.timed[len(timed_first):]]}, f)
    finally:
        dist.destroy_process_group()


def test_my_share_is_round_robin():
    assert my_share(list(range(7)), 0, 3) == [0, 3, 6]
    assert my_share(list(range(7)), 2, 3) == [2, 5]
    assert my_share([1], 1, 2) == []


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built in")
def test_two_ranks_agree_on_the_winner_although_their_timers_disagree(tmp_path):
    torch.multiprocessing.spawn(_rank_main, args=(str(tmp_path),), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    keys = [c.key() for c in CONFIGS]

    # Key one: each config timed once, by its round-robin rank; merged tables identical on both ranks.
    assert r0["timed1"] == keys[0::2] and r1["timed1"] == keys[1::2]
    assert r0["ms1"] == r1["ms1"] == [BASE[c] if i % 2 == 0 else 10.0 - BASE[c] for i, c in enumerate(CONFIGS)]
    assert r0["winner1"] == r1["winner1"] == keys[0]

    # Key two: the configs rank 0 had stored are timed by nobody; the rest are split between the ranks.
    assert sorted(r0["timed2"] + r1["timed2"]) == sorted(keys[4:])
    assert r0["timed2"] == keys[4::2] and r1["timed2"] == keys[5::2]
    assert r0["ms2"] == r1["ms2"]
    assert r0["winner2"] == r1["winner2"] == keys[2]

    # Both ranks stored the merged results of both keys.
    stores = [sorted(p.read_text() for p in (tmp_path / f"cache-rank{r}" / "autotune").glob("*.json"))
              for r in (0, 1)]
    assert len(stores[0]) == 2 and stores[0] == stores[1]
