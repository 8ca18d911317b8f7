"""How the MoE layers move rows between ranks: the all-to-all exchange, and the two transports of
`qbench moe --system blocks` (all_to_all fallback, symmetric memory).

`A2AExchange.start(out, inp, out_splits, in_splits)` moves rows between ranks with
all_to_all_single and uneven splits (rows, dim 0) and returns a handle with wait() (the all-to-all
layer's dispatch and combine; another exchange only needs the same method).

The blocks transports move rows between a rank's source layout and the owners' packed layouts of a
block plan (blocks.BlockPlan), fused with one expert product each; both calls are collectives:
  pull_matmul(src [S, K], w [L, K, N], bias [L, N] | None, plan) -> (out [R, N], gathered [R, K])
  matmul_push(a [R, K], w, bias, plan) -> rows [S, N] in this rank's source layout
`A2ATransport` does both with all_to_all_single and the grouped GEMM (the path for CPU/gloo and for
GPUs without symmetric memory). `SymmTransport` does them with peer loads and stores, no all_to_all:
  pull_matmul: every rank copies its source rows into its symmetric "pull" buffer; barrier; every
      owner runs gather_matmul, whose programs load each block straight from the source rank's buffer.
  matmul_push: every owner runs matmul_scatter, whose programs store each block's product straight
      into the source rank's symmetric "push" buffer; barrier; every rank clones its received rows out.

Buffers: two per transport (one layer), allocated with torch.distributed._symmetric_memory (empty +
rendezvous, a collective) and grown only when a step needs more; every rank sizes them from the same
numbers (the largest S over ranks, from counts_all) so that the collective allocation stays in step.
A device table holds the W peers' buffers as element offsets from the local one (typed pointers
with known alignment, so the kernels' peer loads and stores are vectorised).
NVLink multicast stays off (qbench.dist sets TORCH_SYMM_MEM_DISABLE_MULTICAST=1 on every rank): plain
peer loads and stores only.

Barriers (handle.barrier, stream-ordered on the device, no host sync) sit at the hand-over points:
"sources wrote -> owners read" in pull, "owners wrote -> sources read" in push. A buffer is written
again only after a barrier that follows its last use; forward and backward alternate pull and push,
so each call's own barrier is that barrier and each call costs one. Two pulls in a row add one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kernels import block_gemm
from kernels import grouped_gemm as gg  # module attribute: tests wrap gg.grouped_matmul_forward


class _Done:
    def wait(self) -> None:
        return None


class A2AExchange:
    """all_to_all_single with uneven splits; asynchronous so that chunks can pipeline."""

    def __init__(self, group=None):
        self.group = group

    def start(self, out, inp, out_splits: list[int], in_splits: list[int]):
        import torch.distributed as dist

        if dist.get_world_size(self.group) == 1:
            out.copy_(inp)
            return _Done()
        return dist.all_to_all_single(
            out, inp, output_split_sizes=out_splits, input_split_sizes=in_splits,
            group=self.group, async_op=True,
        )


def local_rows(plan):
    """Packed local row of every row this rank receives, [R] int64, in all_to_all's order (source s,
    then local expert l, then row j): row j of segment (l, s) sits at seg_start(l, s) + j."""
    import torch

    if "local_rows" in plan.cache:
        return plan.cache["local_rows"]
    W, L, r = plan.world_size, plan.num_local_experts, plan.rank
    mine = plan.counts_all[:, r * L:(r + 1) * L]  # [W, L]
    sizes = mine.t().reshape(-1)  # order (l, s)
    first = (torch.cumsum(sizes, 0) - sizes).view(L, W)
    lens = mine.reshape(-1)  # order (s, l)
    R = plan.recv_rows
    seg = torch.repeat_interleave(torch.arange(W * L, device=lens.device), lens, output_size=R)
    j = torch.arange(R, device=lens.device) - (torch.cumsum(lens, 0) - lens)[seg]
    plan.cache["local_rows"] = first[seg % L, seg // L] + j
    return plan.cache["local_rows"]


def local_pull(src, w, bias, plan, backend: str):
    """pull_matmul when plan.all_local: the source rows are the gathered rows (no copy, no exchange)."""
    return gg.grouped_matmul_forward(src, w, plan.offsets_local, bias, backend=backend), src


class A2ATransport:
    """The block plan over all_to_all_single: rows for owner r are contiguous in the source layout,
    so the send buffer is the source layout itself (split sizes = rows per owner); the owner puts
    what it receives in its packed local layout, runs the grouped GEMM over offsets_local, and the
    push gathers the rows back into all_to_all order."""

    name = "a2a"

    def __init__(self, group=None, backend: str = "auto"):
        self.exchange, self.backend = A2AExchange(group), backend

    def pull_matmul(self, src, w, bias, plan):
        if plan.all_local:
            return local_pull(src, w, bias, plan, self.backend)
        recv = src.new_empty((plan.recv_rows, src.shape[1]))
        self.exchange.start(recv, src.contiguous(), plan.recv_splits, plan.send_splits).wait()
        gathered = src.new_empty((plan.gathered_rows, src.shape[1])).index_copy_(0, local_rows(plan), recv)
        return gg.grouped_matmul_forward(gathered, w, plan.offsets_local, bias, backend=self.backend), gathered

    def matmul_push(self, a, w, bias, plan):
        out = gg.grouped_matmul_forward(a, w, plan.offsets_local, bias, backend=self.backend)
        if plan.all_local:
            return out
        rows = out.index_select(0, local_rows(plan))
        back = out.new_empty((plan.src_rows, out.shape[1]))
        self.exchange.start(back, rows, plan.send_splits, plan.recv_splits).wait()
        return back


def make_transport(kind: str, group=None, device: str = "cpu", backend: str = "auto",
                   local_world_size: int | None = None):
    """kind "auto": the symmetric-memory transport where it says it can run, else all_to_all;
    "a2a" / "symm" force one (symm raises when it is unavailable); "symm-fused-ga" / "symm-fused":
    symm with the push (and the pull) fused into the GEMM (MODES). local_world_size: ranks on this
    node (None: every rank). Returns (transport, reason)."""
    if kind == "a2a":
        return A2ATransport(group, backend), "forced"
    ok, reason = symm_available(group, device, local_world_size)
    if not ok:
        if kind.startswith("symm"):
            raise RuntimeError(f"symmetric memory unavailable: {reason}")
        return A2ATransport(group, backend), reason
    mode = kind.removeprefix("symm-") if kind.startswith("symm-") else "split"
    return SymmTransport(group=group, device=device, backend=backend, mode=mode), reason


def symm_available(group=None, device=None, local_world_size: int | None = None) -> tuple[bool, str]:
    """(usable, reason) for the symmetric-memory transport on this group and device. Collective on a
    CUDA NCCL group (ranks agree through one all_reduce), so every rank picks the same transport.
    local_world_size: ranks on this node (qbench.dist's RankContext; None: every rank of the group)."""
    import torch
    import torch.distributed as dist

    dev = torch.device(device) if device is not None else None
    if dev is None or dev.type != "cuda" or not torch.cuda.is_available():
        return False, "needs CUDA devices (this run is on the CPU)"
    if not dist.is_initialized() or dist.get_backend(group) != "nccl":
        return False, "needs an NCCL process group"
    ok, reason = _local_check(dev, dist.get_world_size(group), local_world_size)
    flag = torch.tensor([1 if ok else 0], device=dev)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    if ok and int(flag.item()) == 0:
        return False, "symmetric memory is unusable on another rank"
    return ok, reason


def _local_check(dev, world: int, local_world_size: int | None) -> tuple[bool, str]:
    import torch

    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError as exc:
        return False, f"torch has no symmetric memory ({exc})"
    if world > torch.cuda.device_count() or (local_world_size is not None and local_world_size != world):
        return False, "ranks span several nodes (peer memory reaches only this node's GPUs)"
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    blocked = [j for j in range(torch.cuda.device_count())
               if j != index and not torch.cuda.can_device_access_peer(index, j)]
    if blocked:
        return False, f"GPU {index} cannot access peer GPUs {blocked}"
    return True, "symmetric memory with peer loads/stores"


@dataclass
class _Buffer:
    """One symmetric buffer: local flat bytes, its handle, and the peers' table of base addresses."""

    flat: Any  # uint8 [capacity bytes], symmetric allocation
    handle: Any
    addresses: list  # the W peers' device addresses of `flat` (bytes)
    last_use: int = -1  # barrier epoch after which peers last used it (-1: never)
    tables: dict = field(default_factory=dict)  # (cols, dtype) -> PeerTable, built once

    def view(self, rows: int, cols: int, dtype):
        return self.flat[: rows * cols * _itemsize(dtype)].view(dtype).view(rows, cols)

    def table(self, cols: int, dtype) -> block_gemm.PeerTable:
        key = (cols, dtype)
        if key not in self.tables:  # the local buffer, typed, anchors the peers' element offsets
            anchor = self.flat[: (self.flat.numel() // _itemsize(dtype)) * _itemsize(dtype)].view(dtype)
            self.tables[key] = block_gemm.make_peer_table(self.addresses, anchor, cols)
        return self.tables[key]


def _itemsize(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


MODES = ("split", "fused-ga", "fused")


class SymmTransport:
    """Block plan over symmetric memory. mode "split" (default): gather_rows pulls the blocks (each
    byte crosses NVLink once), then the grouped GEMM runs on local rows; the push runs the grouped
    GEMM, then scatter_rows stores the rows to their sources. "fused-ga": the push's product stores
    its tiles to the peers itself (matmul_scatter: 64-row tiles, measured 364 against 505 TFLOP/s for
    the grouped GEMM on an H200). "fused": the pull's product also loads its A tiles from the peers
    (every N tile of a block re-reads the block over NVLink). On 4 x H200 at the seed config one
    pull + push took 0.80 ms with a split pull and a fused push, 2.71 ms fused, 0.86 ms over
    all_to_all (locality 1/4); `scripts/gpu_moe.sh transports` measures them again."""

    def __init__(self, group=None, device=None, backend: str = "auto", mode: str = "split",
                 max_rows: int | None = None):
        import torch

        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.group, self.backend, self.mode, self.max_rows = group, backend, mode, max_rows
        self.name = "symm" if mode == "split" else f"symm-{mode}"  # the record's transport param
        self.device = torch.device(device) if device is not None else torch.device("cuda")
        self._buffers: dict[str, _Buffer] = {}
        self._epoch = 0  # barriers issued so far (identical on every rank: the calls are collective)

    # -- the two calls of the interface -------------------------------------------------------

    def pull_matmul(self, src, w, bias, plan):
        if plan.all_local:  # every rank's rows are its own: no peer access, no barrier on any rank
            return local_pull(src, w, bias, plan, self.backend)
        K = src.shape[1]
        buf = self._ready("pull", self._capacity(plan), K, src.dtype)
        mine = buf.view(src.shape[0], K, src.dtype)
        if mine.data_ptr() != src.data_ptr() or mine.stride() != src.stride():
            mine.copy_(src)  # callers that write into `source_buffer` skip this copy
        self._barrier(buf)  # sources wrote -> owners read
        table = buf.table(K, src.dtype)
        if self.mode != "fused":
            gathered = src.new_empty((plan.gathered_rows, K))
            block_gemm.gather_rows(table, plan, gathered)
            return gg.grouped_matmul_forward(gathered, w, plan.offsets_local, bias, backend=self.backend), gathered
        return block_gemm.gather_matmul(table, plan, w, bias)

    def matmul_push(self, a, w, bias, plan):
        N = w.shape[2]
        if plan.all_local:
            return gg.grouped_matmul_forward(a, w, plan.offsets_local, bias, backend=self.backend)
        buf = self._ready("push", self._capacity(plan), N, a.dtype)
        if self.mode == "split":
            out = gg.grouped_matmul_forward(a, w, plan.offsets_local, bias, backend=self.backend)
            block_gemm.scatter_rows(out, buf.table(N, a.dtype), plan)
        else:
            block_gemm.matmul_scatter(a, w, bias, buf.table(N, a.dtype), plan)
        self._barrier(buf)  # owners wrote -> sources read
        return buf.view(plan.src_rows, N, a.dtype).clone()

    def source_buffer(self, plan, cols: int, dtype):
        """This rank's [S, cols] view of the pull buffer, for callers that write their rows in place."""
        buf = self._ready("pull", self._capacity(plan), cols, dtype)
        return buf.view(plan.src_rows, cols, dtype)

    # -- buffers and barriers -------------------------------------------------------------------

    def _capacity(self, plan) -> int:
        """Rows every rank's buffers hold: max_rows when given, else the largest S over ranks (the
        same host number on every rank: counts_all is identical everywhere; read once per plan)."""
        if self.max_rows is not None:
            if plan.src_rows > self.max_rows:
                raise ValueError(f"{plan.src_rows} source rows exceed the transport's max_rows={self.max_rows}")
            return self.max_rows
        known = getattr(plan, "max_src_rows", None)
        if known is not None:
            return int(known)
        cache = getattr(plan, "cache", None)
        if cache is not None and "max_src_rows" in cache:
            return cache["max_src_rows"]
        rows = int(plan.counts_all.sum(1).max().item())  # one host read per plan (forward + backward)
        if cache is not None:
            cache["max_src_rows"] = rows
        return rows

    def _ready(self, role: str, rows: int, cols: int, dtype) -> _Buffer:
        """The role's buffer, large enough for [rows, cols] of dtype, safe to write now."""
        need = max(1, rows * cols * _itemsize(dtype))
        buf = self._buffers.get(role)
        if buf is None or buf.flat.numel() < need:
            # grown buffers keep some slack so that a slightly larger step does not reallocate
            size = need if buf is None else max(need, buf.flat.numel() * 5 // 4)
            if buf is not None and buf.last_use == self._epoch:
                self._barrier(None)  # peers may still read the old buffer
            buf = self._allocate(size)
            self._buffers[role] = buf
        elif buf.last_use == self._epoch:
            self._barrier(None)  # no barrier since the peers last used this buffer
        return buf

    def _allocate(self, nbytes: int) -> _Buffer:
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        flat = symm_mem.empty(nbytes, dtype=torch.uint8, device=self.device)
        handle = symm_mem.rendezvous(flat, self.group if self.group is not None else dist.group.WORLD)
        offset = flat.data_ptr() - handle.buffer_ptrs[handle.rank]  # the tensor may sit inside a pool segment
        return _Buffer(flat, handle, [p + offset for p in handle.buffer_ptrs])

    def _barrier(self, used: _Buffer | None) -> None:
        handle = used.handle if used is not None else next(iter(self._buffers.values())).handle
        handle.barrier(channel=0)
        self._epoch += 1
        if used is not None:
            used.last_use = self._epoch
