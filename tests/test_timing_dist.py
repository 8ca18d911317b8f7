"""time_ranks over two gloo processes: the step time is the maximum over ranks."""

import os
import socket

import pytest

pytestmark = pytest.mark.dist


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, out):
    import time

    import torch.distributed as dist

    from qbench import timing
    from qbench.dist import max_over_ranks, min_over_ranks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)

    # rank 1 is slower by construction (busy work, not sleep), so the maximum must come from rank 1
    def step(i):
        end = time.monotonic() + (0.004 if rank == 1 else 0.0005)
        while time.monotonic() < end:
            pass

    result = timing.time_ranks(step, steps=5, warmup=1, device="cpu")
    local = max_over_ranks([float(rank)])
    lowest = min_over_ranks([float(rank), 5.0 - rank])
    out[rank] = (list(result.samples_ms), local, lowest)
    dist.destroy_process_group()


def test_time_ranks_takes_the_max_over_ranks():
    import torch.multiprocessing as mp

    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_worker, args=(2, _free_port(), out), nprocs=2, join=True)
    samples0, max0, min0 = out[0]
    samples1, max1, min1 = out[1]
    assert samples0 == samples1  # every rank reports the same per-step maxima
    assert min(samples0) >= 3.5  # rank 1's 4 ms of work dominates rank 0's 0.5 ms
    assert max0 == max1 == [1.0]
    assert min0 == min1 == [0.0, 4.0]  # elementwise: rank 0's first value, rank 1's second
