"""Grouped GEMM: one launch computes a separate matmul for every group of rows.

Math (G groups, rows of x in S = R * G segments, segment s owns rows offsets[s]:offsets[s+1] and
belongs to group s % G; R = 1 is the plain case of one segment per group):
    y[r, :] = x[r, :] @ w[s % G] (+ bias[s % G])             for every row r of segment s
    x [T, K], w [G, K, N], offsets int64 [S + 1] (offsets[0] = 0, offsets[S] = T, non-decreasing;
    empty segments allowed), bias [G, N] or None  ->  y [T, N] in x.dtype, fp32 accumulation.
Segments let a caller multiply rows in the order an all-to-all delivers them (source-major: source
rank, then local expert) without first permuting them into expert-major order.
The weight gradient of the same product is a second grouped kernel (`grouped_matmul_wgrad`, its
kernel in kernels/grouped_gemm_wgrad.py, with the bias gradient fused: `grouped_wgrad_bias`):
    dw[g] = sum over the segments s of g of x[rows of s]^T @ dy[rows of s]   -> [G, K, N]
and the input gradient is the forward kernel with w transposed (a strided view, no copy).
An FFN's activation comes with the product (the pointer kernel's epilogue,
kernels._common.activation_epilogue; after the TMA kernel, torch's elementwise kernels: _launch_fwd):
    grouped_matmul_act       (pre, act(pre)) of x @ w + bias
    grouped_matmul_act_grad  (dy @ w) * act'(pre), w transposed          (d act only in dpre's buffer)
The forward kernels: kernels/grouped_gemm_tma.py (Hopper, persistent, TMA) where it applies, else
kernels/grouped_gemm_pointer.py.

Used by the MoE expert FFN (one group per local expert) and by FragmentedLinear (one group per
fragment). The tile map is computed inside the kernel from `offsets`, so a launch never reads the
group sizes on the host (no device-to-host synchronisation).

`grouped_matmul` is differentiable (autograd.Function over the two kernels). Where torch ships its
own grouped matmul (`torch._grouped_mm`, CUTLASS on Hopper), `backend="torch"` uses it instead;
`backend="auto"` (the default) runs Triton, and callers that measured torch's kernel to be faster
on their GPU pass backend="torch" explicitly (qbench moe does so and records which ran).
Eager calls launch directly and replay compiled kernels (kernels._common.launch.LaunchCache; the row count
T is keyed by how Triton specializes it, so a layer whose row counts change every step still
replays); while torch.compile traces, each public function is a custom op (torch.ops.qbench.grouped_mm,
grouped_mm_act, grouped_mm_act_grad, grouped_wgrad, grouped_wgrad_bias) with a shape-only fake.
"""

from __future__ import annotations

import torch

from kernels._common import PRODUCT, Epilogue, epilogue, interpreting, is_compiling, register_op, use_triton
from kernels.grouped_gemm_pointer import pointer_fwd
from kernels.grouped_gemm_wgrad import grouped_bias_reference, grouped_wgrad_reference, launch_wgrad

IMPLS = ("auto", "tma", "pointer")  # Triton forward kernels: TMA where it applies, TMA, pointer


def _check(x, w, offsets, bias) -> None:
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[1]:
        raise ValueError(f"grouped_matmul needs x [T, K] and w [G, K, N]; got {tuple(x.shape)}, {tuple(w.shape)}")
    G = w.shape[0]
    segments = offsets.numel() - 1
    if offsets.dim() != 1 or segments < 0 or (segments % G if G else segments):
        raise ValueError(f"offsets must have R * G + 1 entries (G = {G} groups, R >= 1 segments each), "
                         f"got {tuple(offsets.shape)}")
    if bias is not None and tuple(bias.shape) != (w.shape[0], w.shape[2]):
        raise ValueError(f"bias must be [G, N] = {(w.shape[0], w.shape[2])}, got {tuple(bias.shape)}")


def segments_per_group(offsets, num_groups: int) -> int:
    """R of offsets [R * G + 1] (1 when there are no groups)."""
    return (offsets.numel() - 1) // num_groups if num_groups else 1


def _launch_fwd(x, w, offsets, bias, out=None, impl: str = "auto", epi: Epilogue = PRODUCT):
    """Triton forward launch; w may be any strided view (the input gradient passes w^T); `out` (a
    row-contiguous [T, N] view) receives y when given; impl: see grouped_matmul_forward; epi: the
    kernels._common.Epilogue around the product (its pre [T, N] with y's row stride).
    The pointer kernel applies the activation in its epilogue. The persistent TMA kernel does not: it
    runs a tile's epilogue after the tile's K loop, not beside the next one, and on an H200 at the moe
    seed shapes (16384 rows, 1024 <-> 4096, 8 experts, fp16) its GELU epilogue cost more than torch's
    elementwise pass after the plain product (forward 396 against 305 us, backward 531 against 331)."""
    T, K = x.shape
    G, _, N = w.shape
    y = torch.empty((T, N), dtype=x.dtype, device=x.device) if out is None else out
    if T == 0 or N == 0:
        return y
    if epi.pre is not None and epi.pre.stride() != y.stride():
        raise ValueError(f"pre {tuple(epi.pre.stride())} and y {tuple(y.stride())} must share their strides")
    product = epi.pre if epi.kind == "act" else y  # the activation epilogue keeps the product as pre
    if K == 0 or G == 0:
        product.zero_() if bias is None else product.copy_(_bias_rows(bias, offsets, T))
        return _activation_after(y, epi)
    if offsets.dtype != torch.int64 or offsets.device != x.device or not offsets.is_contiguous():
        offsets = offsets.to(device=x.device, dtype=torch.int64).contiguous()
    if _takes_tma(x, w, offsets, y, bias, impl):
        from kernels import grouped_gemm_tma as tma

        tma.launch_fwd(x, w, offsets, bias, product)
        return _activation_after(y, epi)
    return pointer_fwd(x, w, offsets, bias, y, epi)


def _activation_after(y, epi: Epilogue):
    """The epilogue as torch's elementwise kernels after the product: "act": y = act(pre) (the product
    is in pre); "act_grad": y = y * act'(pre), in place; none: y as it is."""
    if epi.kind == "act":
        return _act_torch(epi.pre, epi.activation, out=y)
    if epi.kind == "act_grad":
        return _act_grad_torch(y, epi.pre, epi.activation, out=y)
    return y


def _takes_tma(x, w, offsets, y, bias, impl: str) -> bool:
    """Whether the forward runs the persistent TMA kernel (kernels/grouped_gemm_tma.py): impl "auto"
    where `supported` says so (Hopper, fp16/bf16, aligned), "tma" always (ValueError where its shapes
    do not suit; under the interpreter only the shapes are checked), "pointer" never."""
    from kernels import grouped_gemm_tma as tma

    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if impl == "pointer":
        return False
    if impl == "auto":
        return tma.supported(x, w, offsets, y, bias)
    if not (tma.shapes_supported if interpreting() else tma.supported)(x, w, offsets, y, bias):
        raise ValueError("impl='tma': the TMA kernel needs a Hopper GPU, fp16/bf16, 16-byte aligned rows and "
                         f"K % {tma.BK_TMA} == 0 for plain w; got x {tuple(x.shape)} {x.dtype}, w {tuple(w.shape)}")
    return True


def _group_ids(offsets, T):
    """Segment index of every row, [T] int64, computed on the device (output_size avoids a sync)."""
    counts = (offsets[1:] - offsets[:-1]).to(torch.int64)
    ids = torch.arange(counts.numel(), device=offsets.device)
    return torch.repeat_interleave(ids, counts, output_size=T)


def _bias_rows(bias, offsets, T):
    """bias [S or G, N] -> the bias row of every row's segment [T, N]."""
    return bias.index_select(0, _group_ids(offsets.to(bias.device), T) % bias.shape[0])


def _torch_offs(offsets):
    """torch._grouped_mm takes int32 end offsets [G] (no leading zero)."""
    return offsets[1:].to(torch.int32)


def _forward(x, w, offsets, bias, backend: str, out, impl: str):
    """grouped_matmul_forward on the eager path (every backend)."""
    if backend == "reference" or (backend == "auto" and not use_triton(x, w)):
        y = grouped_matmul_reference(x, w, offsets, bias)
    elif backend == "torch":
        ws, bs = _per_segment(w, offsets), None if bias is None else _per_segment(bias, offsets)
        y = torch._grouped_mm(x, ws, offs=_torch_offs(offsets))
        y = y if bias is None else y + _bias_rows(bs, offsets, x.shape[0])
    else:
        return _launch_fwd(x, w, offsets, bias, out, impl)
    return y if out is None else out.copy_(y)


def _act_torch(t, activation: str, out=None):
    """relu or erf GELU of t, in t.dtype (the unfused activation), into out when given."""
    f = torch.ops.aten.relu if activation == "relu" else torch.ops.aten.gelu
    return f(t) if out is None else f.out(t, out=out)


def _act_grad_torch(grad, pre, activation: str, out=None):
    """The unfused activation backward: grad * act'(pre), in grad.dtype, into out when given (which may
    be grad itself)."""
    if activation == "relu":
        f = torch.ops.aten.threshold_backward
        return f(grad, pre, 0) if out is None else f.grad_input(grad, pre, 0, grad_input=out)
    f = torch.ops.aten.gelu_backward
    return f(grad, pre) if out is None else f.grad_input(grad, pre, grad_input=out)


def _forward_act(x, w, offsets, bias, activation: str, backend: str, out):
    """(pre, act) on the eager path: the Triton product with its activation (_launch_fwd), or the
    product then the activation on the other backends; out = (pre, act) buffers or None."""
    pre_o, act_o = out if out is not None else (None, None)
    if backend in ("auto", "triton") and use_triton(x, w):
        pre = torch.empty((x.shape[0], w.shape[2]), dtype=x.dtype, device=x.device) if pre_o is None else pre_o
        act = _launch_fwd(x, w, offsets, bias, act_o, "auto", epilogue("act", activation, pre))
        return pre, act
    pre = _forward(x, w, offsets, bias, backend, pre_o, "auto")
    return pre, _act_torch(pre, activation, act_o)


def _forward_act_grad(dy, w, offsets, pre, activation: str, backend: str, out):
    """dpre on the eager path (see grouped_matmul_act_grad)."""
    if backend in ("auto", "triton") and use_triton(dy, w):
        return _launch_fwd(dy, w, offsets, None, out, "auto", epilogue("act_grad", activation, pre))
    dact = _forward(dy, w, offsets, None, backend, out, "auto")
    return _activation_after(dact, epilogue("act_grad", activation, pre))  # in place: no buffer of its own


def _per_segment(t, offsets):
    """t [G, ...] repeated for R segments per group -> [R * G, ...] (a copy when R > 1): torch's
    grouped matmul has no notion of segments sharing a weight."""
    R = segments_per_group(offsets, t.shape[0])
    return t if R == 1 else t.repeat(R, *([1] * (t.dim() - 1)))


def _wgrad(x, dy, offsets, num_groups: int, backend: str):
    if backend == "reference" or (backend == "auto" and not use_triton(x, dy)):
        return grouped_wgrad_reference(x, dy, offsets, num_groups)
    if backend == "torch":
        R = segments_per_group(offsets, num_groups)
        dw = torch._grouped_mm(x.t(), dy, offs=_torch_offs(offsets))
        return dw if R == 1 else dw.view(R, num_groups, *dw.shape[1:]).sum(0)
    return launch_wgrad(x, dy, offsets, num_groups)


# ------------------------------------------------------------------------ public API and custom ops


def _op_fwd(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None, backend: str,
            impl: str) -> torch.Tensor:
    return _forward(x, w, offsets, bias, backend, None, impl)


def _op_fwd_act(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None,
                activation: str, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_act(x, w, offsets, bias, activation, backend, None)


def _op_fwd_act_grad(dy: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, pre: torch.Tensor, activation: str,
                     backend: str) -> torch.Tensor:
    return _forward_act_grad(dy, w, offsets, pre, activation, backend, None)


def _op_wgrad(x: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor, num_groups: int,
              backend: str) -> torch.Tensor:
    return _wgrad(x, dy, offsets, num_groups, backend)


def _wgrad_bias(x, dy, offsets, num_groups: int, backend: str):
    if backend in ("auto", "triton") and use_triton(x, dy):
        return launch_wgrad(x, dy, offsets, num_groups, with_bias=True)
    return _wgrad(x, dy, offsets, num_groups, backend), _bias_grad(dy, offsets, num_groups, backend)


def _op_wgrad_bias(x: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor, num_groups: int,
                   backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _wgrad_bias(x, dy, offsets, num_groups, backend)


_OPS = {"fwd": register_op("grouped_mm", _op_fwd,
                           lambda x, w, offsets, bias, backend, impl: x.new_empty((x.shape[0], w.shape[2]))),
        "fwd_act": register_op("grouped_mm_act", _op_fwd_act,
                               lambda x, w, offsets, bias, act, backend: (x.new_empty((x.shape[0], w.shape[2])),
                                                                          x.new_empty((x.shape[0], w.shape[2])))),
        "fwd_act_grad": register_op("grouped_mm_act_grad", _op_fwd_act_grad,
                                    lambda dy, w, offsets, pre, act, backend: torch.empty_like(pre)),
        "wgrad": register_op("grouped_wgrad", _op_wgrad,
                             lambda x, dy, offsets, g, backend: x.new_empty((g, x.shape[1], dy.shape[1]))),
        "wgrad_bias": register_op("grouped_wgrad_bias", _op_wgrad_bias,
                                  lambda x, dy, offsets, g, backend: (x.new_empty((g, x.shape[1], dy.shape[1])),
                                                                      dy.new_empty((g, dy.shape[1]))))}


def grouped_matmul_forward(x, w, offsets, bias=None, *, backend: str = "auto", out=None, impl: str = "auto"):
    """y = x @ w[s % G] (+ bias[s % G]) per segment s, no autograd; written into `out` when given.
    backend: auto | triton | torch | reference. impl (Triton only): "auto" (the persistent TMA kernel
    where it applies, else the pointer kernel), "tma" or "pointer". Under torch.compile every backend
    but "torch" (an aten op, traced as is) is one custom op."""
    if backend != "torch" and is_compiling():
        y = _OPS["fwd"](x, w, offsets, bias, backend, impl)
        return y if out is None else out.copy_(y)
    return _forward(x, w, offsets, bias, backend, out, impl)


def grouped_matmul_act(x, w, offsets, bias, activation: str, *, backend: str = "auto", out=None):
    """(pre, act): pre = x @ w[s % G] + bias[s % G] per segment and act = activation(pre) ("gelu": exact
    erf GELU, as F.gelu; "relu"), both [T, N] in x.dtype (on the Triton backend the pointer kernel
    applies the activation in its epilogue, the TMA kernel leaves it to torch: _launch_fwd). out: (pre,
    act) buffers or None."""
    if is_compiling():
        pre, act = _OPS["fwd_act"](x, w, offsets, bias, activation, backend)
        return (pre, act) if out is None else (out[0].copy_(pre), out[1].copy_(act))
    return _forward_act(x, w, offsets, bias, activation, backend, out)


def grouped_matmul_act_grad(dy, w, offsets, pre, activation: str, *, backend: str = "auto", out=None):
    """dpre = (dy @ w[s % G]) * activation'(pre) per segment, [T, N] in dy.dtype: the input gradient of
    act(pre) @ w (pass w transposed, a strided view) with the activation's backward in the product's
    epilogue, or in place after it (the TMA kernel): the output gradient of act has no buffer of its own."""
    if is_compiling():
        dpre = _OPS["fwd_act_grad"](dy, w, offsets, pre, activation, backend)
        return dpre if out is None else out.copy_(dpre)
    return _forward_act_grad(dy, w, offsets, pre, activation, backend, out)


def grouped_matmul_wgrad(x, dy, offsets, num_groups: int, *, backend: str = "auto"):
    """dw[g] = sum over g's segments of x_s^T @ dy_s -> [G, K, N] in x.dtype (fp32 accumulation);
    empty groups give zeros."""
    if backend != "torch" and is_compiling():
        return _OPS["wgrad"](x, dy, offsets, num_groups, backend)
    return _wgrad(x, dy, offsets, num_groups, backend)


def grouped_wgrad_bias(x, dy, offsets, num_groups: int, *, backend: str = "auto"):
    """(dw [G, K, N], db [G, N]) of a product with a bias: grouped_matmul_wgrad and grouped_bias_grad,
    on the Triton backend in one launch (the bias gradient sums the dy tiles the weight gradient reads)."""
    if backend != "torch" and is_compiling():
        return _OPS["wgrad_bias"](x, dy, offsets, num_groups, backend)
    return _wgrad_bias(x, dy, offsets, num_groups, backend)


def grouped_bias_grad(dy, offsets, num_groups: int, *, backend: str = "auto"):
    """db[g] = sum of dy over the rows of group g -> [G, N] in dy.dtype (fp32 sums).

    On the kernel backends this is the weight-gradient kernel with a column of ones (one streaming
    read of dy on the tensor cores); the reference path adds rows into an fp32 buffer. A product's
    weight and bias gradients together take grouped_wgrad_bias (one pass over dy)."""
    if backend != "torch" and is_compiling():
        return _OPS["wgrad"](_ones(dy), dy, offsets, num_groups, backend)[:, 0, :]
    return _bias_grad(dy, offsets, num_groups, backend)


def _bias_grad(dy, offsets, num_groups: int, backend: str):
    if backend == "reference" or (backend == "auto" and not use_triton(dy)):
        return grouped_bias_reference(dy, offsets, num_groups)
    return _wgrad(_ones(dy), dy, offsets, num_groups, backend)[:, 0, :]


def _ones(dy):
    return dy.new_ones((dy.shape[0], 16))  # 16: the narrowest tensor-core operand


class GroupedMatmulFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, offsets, bias, backend):
        ctx.save_for_backward(x, w, offsets)
        ctx.has_bias, ctx.backend = bias is not None, backend
        return grouped_matmul_forward(x, w, offsets, bias, backend=backend)

    @staticmethod
    def backward(ctx, dy):
        x, w, offsets = ctx.saved_tensors
        dy = dy.contiguous()
        G = w.shape[0]
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = grouped_matmul_forward(dy, w.transpose(1, 2), offsets, backend=ctx.backend)
        want_db = ctx.has_bias and ctx.needs_input_grad[3]
        if ctx.needs_input_grad[1] and want_db:
            dw, db = grouped_wgrad_bias(x, dy, offsets, G, backend=ctx.backend)
        elif ctx.needs_input_grad[1]:
            dw = grouped_matmul_wgrad(x, dy, offsets, G, backend=ctx.backend)
        elif want_db:
            db = grouped_bias_grad(dy, offsets, G, backend=ctx.backend)
        return dx, dw, None, db, None


def grouped_matmul(x, w, offsets, bias=None, *, backend: str = "auto"):
    """x [T, K] (rows sorted by group), w [G, K, N], offsets int64 [G + 1], bias [G, N] | None
    -> [T, N] in x.dtype with fp32 accumulation. Differentiable in x, w and bias.

    Runs the Triton kernel on CUDA (and on CPU under TRITON_INTERPRET=1), the torch reference
    otherwise; backend="torch" uses torch._grouped_mm (bf16 on Hopper) where the caller chose it.
    """
    _check(x, w, offsets, bias)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, w, bias))
    if not needs_grad:
        return grouped_matmul_forward(x, w, offsets, bias, backend=backend)
    return GroupedMatmulFn.apply(x, w, offsets, bias, backend)


def grouped_matmul_reference(x, w, offsets, bias=None):
    """Plain torch: one matmul per group (fp32 accumulation, result in x.dtype)."""
    _check(x, w, offsets, bias)
    bounds = [int(v) for v in offsets.tolist()]
    y = torch.zeros((x.shape[0], w.shape[2]), dtype=torch.float32, device=x.device)
    for s in range(len(bounds) - 1):
        lo, hi, g = bounds[s], bounds[s + 1], s % max(w.shape[0], 1)
        if hi > lo:
            y[lo:hi] = x[lo:hi].float() @ w[g].float()
            if bias is not None:
                y[lo:hi] += bias[g].float()
    return y.to(x.dtype)
