"""Process launch for multi-rank work: self-spawned ranks, or one rank of a torchrun job.

`launch(fn, args, world_size=..., backend=..., device=...)` runs the generator function
fn(ctx, *args) on every rank and yields what rank 0 yields, as it comes:
- under torchrun (RANK / WORLD_SIZE / LOCAL_RANK set) this process is one rank of a job that may span
  nodes; the process group comes from torchrun's env:// rendezvous; ranks other than 0 yield nothing;
- otherwise it spawns `world_size` processes on this machine (one per GPU with NCCL, CPU processes
  with gloo) over a free loopback port, and relays rank 0's items through a queue.
Failures never hang: a rank that raises sends its error and exits; the launcher then terminates the
others and raises RankFailure naming the rank that failed first (a rank that died without a word, say
killed by a signal, before the peers that lost it) and its error. Collectives carry a timeout
(`timeout_s`, `qbench moe --timeout`), so a rank stuck on a frozen or dead peer also ends. A frozen rank
(SIGSTOP, a hung native call that holds the interpreter) ends the job sooner: every spawned rank beats
a heartbeat from a thread of its own every HEARTBEAT_EVERY_S, and the launcher ends the job with that
rank named once its heartbeat is `heartbeat_s` old (a rank waiting in a collective still beats).
Per-step lists are reduced over ranks (max_over_ranks, min_over_ranks) with one all-reduce each.
torch is imported only inside functions.
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

# Multicast over NVLink is off on the lent multi-GPU machines (and harmless to disable elsewhere); the
# symmetric-memory MoE transport (qbench/layers/moe/transport.py) relies on plain peer loads and stores.
NCCL_DEFAULTS = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
POLL_S = 0.2  # how often the launcher looks at its ranks while waiting for items
GRACE_S = 5.0  # time a terminated rank gets before it is killed
SETTLE_S = 1.0  # after a failure, time the other ranks get to report theirs (so the first one is named)
HEARTBEAT_EVERY_S = 1.0  # how often a spawned rank's heartbeat thread beats
# A rank whose heartbeat is this old is frozen: with SETTLE_S and GRACE_S the job ends within 60 s of the
# freeze. A live rank misses a beat only while one native call holds the interpreter that long.
HEARTBEAT_S = 30.0


class RankFailure(RuntimeError):
    """A rank raised or died; the message names the rank and its error."""


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str  # "cuda:<local_rank>" or "cpu"
    local_world_size: int = 1  # ranks on this node (torchrun's LOCAL_WORLD_SIZE; all of them when spawned)

    @property
    def is_primary(self) -> bool:
        return self.rank == 0


def torchrun_env() -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) when started by torchrun, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))


def is_primary() -> bool:
    """False only on the ranks > 0 of a torchrun job (they must not write results)."""
    env = torchrun_env()
    return env is None or env[0] == 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _init(rank: int, world_size: int, local_rank: int, backend: str, device: str, timeout_s: float,
          init_method: str | None = None) -> RankContext:
    """Join the process group as `rank` of `world_size`. init_method None: torchrun's environment (env://);
    a spawned rank is given its rendezvous address instead, so nothing about the job is in its environment."""
    import torch
    import torch.distributed as dist

    for key, value in NCCL_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, world_size)))
    kwargs = {"device_id": torch.device(device)} if device.startswith("cuda") else {}
    dist.init_process_group(
        backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s),
        **kwargs
    )
    # torchrun's LOCAL_WORLD_SIZE; spawned ranks all run on this node
    local_world_size = world_size if init_method else int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return RankContext(rank, world_size, local_rank, backend, device, local_world_size)


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h): the signal this process gets when its parent dies
PARENT_POLL_S = 1.0  # where prctl is missing: how often a rank's watchdog looks for its launcher


def die_with_parent(parent: int) -> None:
    """End this rank when the launcher (pid `parent`) dies, even by SIGKILL, which gives the launcher no
    chance to stop its ranks: on Linux the kernel sends SIGKILL (prctl PR_SET_PDEATHSIG); elsewhere a daemon
    thread polls the parent pid. A launcher already gone by the time this runs ends the rank at once."""
    import ctypes
    import signal
    import threading

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):  # no libc prctl (not Linux)
        armed = False
    if os.getppid() != parent:  # the launcher died before the signal was armed
        os._exit(1)
    if not armed:
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(PARENT_POLL_S)
            os._exit(1)

        threading.Thread(target=watch, name="qbench-parent-watchdog", daemon=True).start()


def _beat(beats, rank: int) -> None:
    """Heartbeat of a spawned rank (a daemon thread): its time in the shared array, every HEARTBEAT_EVERY_S."""
    while True:
        beats[rank] = time.time()
        time.sleep(HEARTBEAT_EVERY_S)


def _worker(rank, world_size, port, backend, device, timeout_s, fn, args, channel, beats, parent=None) -> None:
    """Body of one spawned rank: run fn, send rank 0's items, report an error and exit 1 on failure; the
    rank beats a heartbeat the launcher watches and ends with its launcher (pid `parent`)."""
    import threading

    if parent is not None:
        die_with_parent(parent)
    threading.Thread(target=_beat, args=(beats, rank), daemon=True, name="qbench-heartbeat").start()
    try:  # rank and world size are arguments here: RANK / WORLD_SIZE in the environment mean a torchrun job
        ctx = _init(rank, world_size, rank, backend, device, timeout_s, init_method=f"tcp://127.0.0.1:{port}")
        for item in fn(ctx, *args):
            if rank == 0:
                channel.put(("item", rank, item))
        channel.put(("done", rank, None))
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the launcher
        channel.put(("error", rank, (time.time(), _describe(exc))))  # the time says which rank failed first
        channel.close()
        channel.join_thread()
        os._exit(1)  # skip interpreter teardown: a peer may be stuck in a collective with us
    _shutdown()


def _describe(exc: BaseException) -> str:
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" (at {os.path.basename(last[0].filename)}:{last[0].lineno})" if last else ""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}{where}"


def launch(
    fn: Callable[..., Iterator[Any]],
    args: tuple = (),
    *,
    world_size: int,
    backend: str,
    device: str,
    timeout_s: float = 600.0,
    heartbeat_s: float = HEARTBEAT_S,
) -> Iterator[Any]:
    """Run fn(ctx, *args) on every rank; yield rank 0's items. See the module docstring (heartbeat_s: how old
    a spawned rank's heartbeat may grow before the job ends with that rank named)."""
    env = torchrun_env()
    if env is not None:
        yield from _run_torchrun(fn, args, env, backend, device, timeout_s)
    else:
        yield from _run_spawned(fn, args, world_size, backend, device, timeout_s, heartbeat_s)


def _run_torchrun(fn, args, env, backend, device, timeout_s) -> Iterator[Any]:
    rank, world_size, local_rank = env
    ctx = _init(rank, world_size, local_rank, backend, device, timeout_s)
    try:
        for item in fn(ctx, *args):
            if ctx.is_primary:
                yield item
    finally:
        _shutdown()


def _run_spawned(fn, args, world_size, backend, device, timeout_s, heartbeat_s) -> Iterator[Any]:
    import torch.multiprocessing as mp

    spawn = mp.get_context("spawn")
    channel = spawn.Queue()
    beats = spawn.Array("d", [0.0] * world_size, lock=False)  # each rank writes its own slot; 0: not started
    port = free_port()
    procs = [
        spawn.Process(target=_worker,
                      args=(r, world_size, port, backend, device, timeout_s, fn, args, channel, beats, os.getpid()))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    try:
        yield from _relay(procs, channel, lambda done: _frozen(procs, beats, done, heartbeat_s))
    finally:
        _stop(procs)


def _frozen(procs, beats, done: set[int], heartbeat_s: float) -> str | None:
    """The failure of the first running rank whose heartbeat is older than heartbeat_s, or None. A rank that
    has not beaten yet (still importing) is not judged: a freeze before that waits for the collective timeout."""
    now = time.time()
    for rank, p in enumerate(procs):
        age = now - beats[rank]
        if rank not in done and p.exitcode is None and beats[rank] > 0 and age > heartbeat_s:
            return (f"rank {rank} stopped responding: no heartbeat for {age:.0f} s (frozen: stopped, or a native "
                    "call holding the interpreter); the job was ended")
    return None


def _relay(procs, channel, frozen=lambda done: None) -> Iterator[Any]:
    """Yield rank 0's items until every rank is done; raise RankFailure on the first failure (frozen(done):
    a frozen rank's failure, or None)."""
    done: set[int] = set()
    while len(done) < len(procs):
        try:
            kind, rank, payload = channel.get(timeout=POLL_S)
        except queue_mod.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                raise RankFailure(_blame(procs, channel, {}, done)) from None
            stuck = frozen(done)
            if stuck is not None:
                raise RankFailure(stuck) from None
            continue
        if kind == "item":
            yield payload
        elif kind == "done":
            done.add(rank)
        else:
            raise RankFailure(_blame(procs, channel, {rank: payload}, done))


def _blame(procs, channel, errors: dict[int, tuple[float, str]], done: set[int]) -> str:
    """Name the rank that failed first. When one rank dies, its peers fail too (a reset connection, a
    timed-out collective), and their errors may arrive first: so wait SETTLE_S for the other reports,
    then blame a rank that died without reporting (a signal, a crash in native code), else the earliest
    error. Ranks still running then are named too: a frozen rank leaves its peers to time out."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        try:
            kind, rank, payload = channel.get(timeout=POLL_S)
        except queue_mod.Empty:
            continue
        if kind == "error":
            errors[rank] = payload
    silent = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in errors]
    first = min(errors, key=lambda r: errors[r][0]) if errors else None
    if silent:
        rank, code = silent[0]
        text = f"rank {rank} died ({_exit_text(code)}) without reporting an error"
        text += f"; then rank {first} failed: {errors[first][1]}" if first is not None else ""
    else:
        text = f"rank {first} failed: {errors[first][1]}"
    running = [r for r, p in enumerate(procs) if p.exitcode is None and r not in errors and r not in done]
    if running:
        text += f"; still running, maybe frozen: rank {', '.join(map(str, running))}"
    return text


def _exit_text(code: int) -> str:
    import signal

    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def max_over_ranks(values_ms: list[float], group=None) -> list[float]:
    """Elementwise maximum over all ranks of a per-step list (one all-reduce)."""
    return _over_ranks(values_ms, "MAX", group)


def min_over_ranks(values: list[float], group=None) -> list[float]:
    """Elementwise minimum over all ranks of a per-step list (one all-reduce)."""
    return _over_ranks(values, "MIN", group)


def _over_ranks(values: list[float], op: str, group) -> list[float]:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or not values:
        return list(values)
    on_gpu = dist.get_backend(group) == "nccl"
    tensor = torch.tensor(values, dtype=torch.float64, device="cuda" if on_gpu else "cpu")
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op), group=group)
    return tensor.cpu().tolist()
