"""Hot-expert replicas: the owners' weights on every rank, and the replicas' gradients back to the owners.

N hot experts (global ids, ascending, so one owner's experts are adjacent), L local experts per rank,
owner of expert e = e // L. Slot h of one packed buffer [N, P] (P = d*h + h + h*d + d, the weights'
dtype) holds expert hot[h]'s (w1 [d, h], b1 [h], w2 [h, d], b2 [d]) flattened.
  forward   the owners write their slots; ONE broadcast per owner of its run of slots (async). The
            replica weights are views of the buffer (slot stride P, no copy).
  backward  the replicas' gradients are packed the same way; ONE reduce per owner; the owner adds its
            slots to its expert gradients.
The broadcasts and reduces run on a second communicator over the same ranks (`side_group`): NCCL runs
one communicator's calls in order on one stream, so on the layer's own communicator 64 MB of hot
weights (4 experts, d 1024, h 4096, fp16) sat between the dispatch and the combine all-to-all and the
reduce behind the last exchange (~0.4 ms each on 4 x H200, in the step's critical path). On their own
communicator they run beside the all-to-alls: callers start the broadcast as soon as the hot experts
are known (before the dispatch) and the reduce as soon as the replicas' gradients exist.
Per-tensor, per-expert collectives (16 for 4 hot experts) cost ~0.8 ms a step on 4 x H200.
"""

from __future__ import annotations

from itertools import groupby

_SIDE_GROUPS: dict = {}


def side_group(group=None):
    """A second process group over the ranks of `group` (None: the world), made once per group. Every
    rank of the world must reach the first call at the same point (dist.new_group is collective)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return group
    base = group if group is not None else dist.group.WORLD
    cached = _SIDE_GROUPS.get(id(base))
    if cached is None or cached[0] is not base:  # holding `base` keeps its id from being reused
        ranks = None if group is None else dist.get_process_group_ranks(group)
        cached = _SIDE_GROUPS[id(base)] = (base, dist.new_group(ranks))
    return cached[1]


class Replicas:
    """One step's replicas of the hot experts `hot` (host list of global ids, ascending)."""

    def __init__(self, hot: list[int], local_experts: int, rank: int, group=None):
        self.hot, self.L, self.rank, self.group = list(hot), local_experts, rank, side_group(group)
        # (owner, first slot, end slot) of every owner's run of adjacent slots
        owners = [e // local_experts for e in self.hot]
        self.runs, h = [], 0
        for owner, members in groupby(owners):
            n = len(list(members))
            self.runs.append((owner, h, h + n))
            h += n
        self._flat = self._grad = None
        self._handles: list = []

    def _sizes(self, w1, w2):
        d, hid = w1.shape[1], w1.shape[2]
        return [d * hid, hid, hid * d, d]

    def _start(self, buf, op) -> None:
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size(self.group) == 1:
            return
        for owner, h0, h1 in self.runs:
            root = dist.get_global_rank(self.group, owner) if self.group is not None else owner
            self._handles.append(op(buf[h0:h1], root, group=self.group, async_op=True))

    def _wait(self) -> None:
        for handle in self._handles:
            handle.wait()
        self._handles = []

    def broadcast(self, w1, b1, w2, b2) -> None:
        """Pack this rank's hot experts into their slots and start the owners' broadcasts."""
        import torch

        self._shapes = (tuple(w1.shape[1:]), tuple(b1.shape[1:]), tuple(w2.shape[1:]), tuple(b2.shape[1:]))
        self._split = self._sizes(w1, w2)
        self._flat = w1.new_empty((len(self.hot), sum(self._split)))
        with torch.no_grad():  # a copy of the weights: their gradients come home through reduce/add_to
            for h, e in enumerate(self.hot):
                if e // self.L == self.rank:
                    l = e % self.L
                    torch.cat([w1[l].reshape(-1), b1[l], w2[l].reshape(-1), b2[l]], out=self._flat[h])
        self._start(self._flat, _broadcast)

    def weights(self):
        """(rw1 [N, d, h], rb1 [N, h], rw2 [N, h, d], rb2 [N, d]): views of the received buffer."""
        self._wait()
        parts = self._flat.split(self._split, dim=1)
        return tuple(p.view(len(self.hot), *s) for p, s in zip(parts, self._shapes))

    def reduce(self, dw1, db1, dw2, db2) -> None:
        """Pack the replicas' gradients and start one reduce per owner."""
        import torch

        n = len(self.hot)
        self._grad = torch.cat([g.reshape(n, -1) for g in (dw1, db1, dw2, db2)], dim=1)
        self._start(self._grad, _reduce)

    def add_to(self, dw1, db1, dw2, db2) -> None:
        """Wait for the reduces; add the summed gradients of this rank's hot experts (in place): one
        add per parameter and run of consecutive local experts (`grad[l] += x` would also copy the
        sum back through __setitem__, a second pass over 8 MB per matrix)."""
        self._wait()
        for owner, h0, h1 in self.runs:
            if owner != self.rank:
                continue
            for a, b in _consecutive([e % self.L for e in self.hot[h0:h1]]):
                parts = self._grad[h0 + a:h0 + b].split(self._split, dim=1)
                l0 = self.hot[h0 + a] % self.L
                for grad, part in zip((dw1, db1, dw2, db2), parts):
                    grad.narrow(0, l0, b - a).add_(part.view(b - a, *grad.shape[1:]))
        self._grad = None


def _consecutive(ids: list[int]) -> list[tuple[int, int]]:
    """[start, end) index ranges of the runs of consecutive values in `ids` (ascending)."""
    runs, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            runs.append((start, i))
            start = i
    return runs


def _broadcast(t, root, group, async_op):
    import torch.distributed as dist

    return dist.broadcast(t, root, group=group, async_op=async_op)


def _reduce(t, root, group, async_op):
    import torch.distributed as dist

    return dist.reduce(t, root, group=group, async_op=async_op)
