"""FragmentedLinear and the structured baselines it is benchmarked against.

FragmentedLinear(in, out, N, c = in/32). x: [B, in], viewed as N fragments x_f: [B, F], F = in/N.
  selector_weights [N, F]      scores s_bf = <x_bf, S_f>, p = softmax_f(s)   [B, N] (fp32)
  expert_weights   [N, F, out] fragment f maps its slice to the full output
  compressor       Linear(in, c, no bias), compressed_net Linear(c, out, no bias): the low-rank path
  expert_bias, compressed_bias [out] when bias=True
Training mode (soft):  y = sum_f p_f (x_f @ W_f) + E(C(x * (1 - p expanded to features)))
Eval mode (hard):      f* = argmax_f p_f;  y = x_{f*} @ W_{f*} + E(C(x with fragment f* zeroed))
Parameters: in + in*out + in*c + c*out (+ 2*out with bias), independent of N.

Fast paths (no per-sample copy of W_{f*}, which is what made the original eval mode slow and
memory-hungry):
- training mode: x scaled per fragment by p, then ONE dense matmul with W viewed as [in, out]; the
  whole soft layer is one autograd node (SoftFragmentedFn) whose backward is six matmuls and the
  selector's two backward kernels;
- eval mode, N small against the batch: x masked to its selected fragment, then the same single
  dense matmul (most fragments are selected, so a grouped GEMM would read most of W anyway);
- eval mode, N >= 4 x batch (fp32) or 16 x batch (16-bit): rows sorted by fragment and one grouped
  GEMM (kernels/grouped_gemm.py) that reads only the selected fragments' weights; its backward is
  two dense matmuls.
`infer(x)` runs the eval path under torch.inference_mode() for real inference.
torch is imported at module level: this module is only imported by benches and tests.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kernels.fragmented import select_scale, select_scale_backward, selector_gradient
from kernels.fragmented_backward import expert_backward, expert_weight_grad, low_rank_input_grad
from kernels.fragmented_experts import expert_sum, fragment_outputs
from kernels.grouped_gemm import grouped_matmul
from qbench.layers.autocast import autocast_dtype, cast_to

SCORE_DTYPE = torch.float32  # selector scores and softmax in fp32: a bf16 argmax would flip near-ties
# dtypes whose low-rank code c = v C^T is computed inside the pass over W (kernels/fragmented_experts.py),
# which saves the eager forward cuBLAS's split-K matmul (a memset and its kernel); fp32 keeps the cuBLAS
# product (beside the pass over W on a side stream in a graph): its exact (IEEE) products made c's few programs
# the pass's straggler (one H200, graphed forward + backward at batch 16: 0.3567 ms with c inside, probe,
# against 0.2835 without; 16-bit: 0.1352 against 0.1354)
FUSED_LOW_RANK = (torch.float16, torch.bfloat16)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")


class FragmentedLinear(nn.Module):
    """Soft-selected fragment experts plus a low-rank path; see the module docstring."""

    def __init__(self, in_features: int, out_features: int, num_fragments: int,
                 compressed_features: int | None = None, bias: bool = False, *, device=None, dtype=None):
        super().__init__()
        if compressed_features is None:
            compressed_features = in_features // 32
        _check_positive(in_features=in_features, out_features=out_features, num_fragments=num_fragments,
                        compressed_features=compressed_features)
        if in_features % num_fragments:
            raise ValueError(f"in_features {in_features} is not divisible by num_fragments {num_fragments}; "
                             "choose a fragment count that divides the input size")
        self.in_features, self.out_features = in_features, out_features
        self.num_fragments, self.compressed_features = num_fragments, compressed_features
        self.fragment_size = in_features // num_fragments
        kw = {"device": device, "dtype": dtype}
        scale = 1.0 / math.sqrt(self.fragment_size)  # the reference's initialisation
        self.selector_weights = nn.Parameter(torch.randn(num_fragments, self.fragment_size, **kw) * scale)
        self.expert_weights = nn.Parameter(
            torch.randn(num_fragments, self.fragment_size, out_features, **kw) * scale)
        self.compressor = nn.Linear(in_features, compressed_features, bias=False, **kw)
        self.compressed_net = nn.Linear(compressed_features, out_features, bias=False, **kw)
        self.has_bias = bias
        if bias:
            self.expert_bias = nn.Parameter(torch.zeros(out_features, **kw))
            self.compressed_bias = nn.Parameter(torch.zeros(out_features, **kw))
        # fragment ids for one-hot masks; F.one_hot would synchronize the device (and break graphs)
        self.register_buffer("fragment_ids", torch.arange(num_fragments, device=device), persistent=False)
        self.eval_path = "auto"  # "auto", "grouped" or "dense": how the hard selection is computed

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"num_fragments={self.num_fragments}, compressed_features={self.compressed_features}, "
                f"bias={self.has_bias}")

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """Selector scores [B, N] in fp32 for x [B, in]."""
        xf = x.view(x.shape[0], self.num_fragments, self.fragment_size)
        return torch.einsum("bnf,nf->bn", xf.to(SCORE_DTYPE), self.selector_weights.to(SCORE_DTYPE))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features, the layer expects {self.in_features}")
        lead = x.shape[:-1]
        x2, p = self._operands(x.reshape(-1, self.in_features))
        with _autocast_off(x2) if p.autocast else contextlib.nullcontext():
            y = self._soft(x2, p) if self.training else self._hard(x2, p)
            if p.bias is not None:
                y = y + p.bias
        return y.reshape(*lead, self.out_features)

    def _operands(self, x: torch.Tensor) -> tuple[torch.Tensor, _Operands]:
        """x and the parameters as the forward takes them: in the autocast dtype where autocast is on for x's
        device (fp32 master weights, 16-bit products, as nn.Linear takes its operands there; the kernels want one
        dtype), else as they are."""
        dtype = autocast_dtype(x)
        biases = (self.expert_bias, self.compressed_bias) if self.has_bias else ()
        x, *params = cast_to(dtype, x, self.selector_weights, self.expert_weights, self.compressor.weight,
                             self.compressed_net.weight, *biases)
        return x, _Operands(*params[:4], params[4] + params[5] if biases else None, dtype is not None)

    @torch.inference_mode()
    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """Hard selection without autograd bookkeeping, whatever the module's training flag."""
        was_training = self.training
        self.eval()
        try:
            return self.forward(x)
        finally:
            self.train(was_training)

    @staticmethod
    def _low_rank(expert_out: torch.Tensor, v: torch.Tensor, p: _Operands) -> torch.Tensor:
        """expert_out + compressed_net(compressor(v)); the add is fused into the last matmul."""
        c = F.linear(v, p.compressor)
        return torch.addmm(expert_out, c, p.expansion.t())

    @staticmethod
    def _soft(x: torch.Tensor, p: _Operands) -> torch.Tensor:
        return SoftFragmentedFn.apply(x, p.selector, p.experts, p.compressor, p.expansion)

    def use_grouped(self, batch: int, dtype: torch.dtype) -> bool:
        """Grouped GEMM when the selected fragments are a small share of W (at most batch/N of it);
        otherwise one dense matmul. The share must be small: on an H200 the grouped kernel's fixed
        cost beat cuBLAS's dense skinny GEMM from 1/4 of W in fp32 but only from 1/16 in 16-bit
        (dtype: the one the products run in)."""
        if self.eval_path != "auto":
            return self.eval_path == "grouped"
        share = 4 if dtype.itemsize >= 4 else 16
        return share * batch <= self.num_fragments

    def _hard(self, x: torch.Tensor, p: _Operands) -> torch.Tensor:
        # u: x kept only on its selected fragment, v: x with it zeroed; idx [B] the selection
        u, v, idx = SelectScale.apply(x, p.selector, True)
        if self.use_grouped(x.shape[0], p.experts.dtype):
            expert = GroupedExperts.apply(x, idx, p.experts)
        else:
            expert = u @ p.experts.view(self.in_features, self.out_features)
        return self._low_rank(expert, v, p)


class _Operands(NamedTuple):
    """The forward's parameters (see FragmentedLinear._operands): S [N, F], W [N, F, out], C [c, in],
    E [out, c], the two biases summed [out] or None; autocast: whether they were cast for autocast."""

    selector: torch.Tensor
    experts: torch.Tensor
    compressor: torch.Tensor
    expansion: torch.Tensor
    bias: torch.Tensor | None
    autocast: bool


def _autocast_off(x: torch.Tensor):
    """Autocast off for x's device: the operands are already in its dtype, and the layer keeps its own choices
    (the selector's scores in fp32)."""
    return torch.autocast(x.device.type, enabled=False)


class SoftFragmentedFn(torch.autograd.Function):
    """The training-mode layer (no bias) as one autograd node: x [B, in], S [N, F], W [N, F, out],
    C [c, in] (compressor), E [out, c] (compressed_net) ->
        (u, v, p) = select_scale(x, S);  c = v C^T;  y = u W_flat + c E^T     (W_flat = W as [in, out])
    Backward: dW = u^T dy, dE = dy^T c, dc = dy E, dC = dc^T v, du = dy W_flat^T, dv = dc C, then
    (dx, dS) from the selector's backward kernel: six matmuls and two kernels, one node for the
    autograd engine to walk instead of five. dW, a rank-B outer product at the layer's batches, is a
    persistent kernel that streams its tiles out (kernels/fragmented_backward.py); when x needs no gradient
    the same pass forms dE and dc, and one light pass dv and dC, so the low-rank path's four small matmuls
    no longer run one after another after dW.
    When x needs no gradient (the layer's input is data), the forward keeps the per-fragment outputs
    z [N, B, out] (z_f = x_f W_f), from one read of W as u W_flat reads it, with the low-rank code c = v C^T
    in the same launch, and forms y = sum_f p_f z_f + c E^T from z in one light pass
    (kernels/fragmented_experts.py): three launches in all; the selector's gradient then takes
    <du_f, x_f> as <dy, z_f>, so backward never reads W for du = dy W_flat^T (the one big matmul a dense
    layer's backward does not have). Only while z is no larger than W (B <= F)."""

    @staticmethod
    def forward(ctx, x, s, w, c_w, e_w):
        u, v, p, _ = select_scale(x, s, False)  # x * p, x * (1 - p)
        n, f = s.shape
        keep_z = not ctx.needs_input_grad[0] and ctx.needs_input_grad[1] and x.shape[0] <= f
        z = expert = None
        if keep_z and x.dtype in FUSED_LOW_RANK:  # z [N, B, out] (W read once) and c = v C^T [B, c], one launch
            z, c = fragment_outputs(x, w, v, c_w)
        else:
            side = _fork(x)  # the pass over W is issued first: the side stream's work never delays it
            if keep_z:
                z = fragment_outputs(x, w)[0]  # [N, B, out]: W read once
            else:
                expert = u @ w.view(-1, w.shape[-1])
            with _on(side):  # the low-rank path's small matmul beside the pass over W
                c = v @ c_w.t()  # [B, c]
            _join(side)
        # y = sum_f p_f z_f + c E^T in one pass over z, or the expert output plus c E^T
        y = expert_sum(z, p, c, e_w) if keep_z else torch.addmm(expert, c, e_w.t())
        ctx.save_for_backward(x, s, p, u, v, c, w, c_w, e_w, z)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, s, p, u, v, c, w, c_w, e_w, z = ctx.saved_tensors
        need_x, need_s, need_w, need_c, need_e = ctx.needs_input_grad
        if z is not None and need_w and need_c and need_e:  # x needs no gradient: the selector's alone, from z
            dw, de, dc = expert_backward(u, dy, c, e_w)  # dW = u^T dy with dE = dy^T c and dc = dy E (fp32)
            dv, dcw = low_rank_input_grad(dc, c_w, v)  # dc C and dc^T v in one pass
            return None, selector_gradient(x, s, p, dv, z, dy), dw.view(w.shape), dcw, de
        side = _fork(dy)  # the big matmuls are issued first: the side stream's work never delays them
        dw = expert_weight_grad(u, dy).view(w.shape) if need_w else None  # u^T dy, streamed out by tiles
        du = None if z is not None else dy @ w.view(-1, w.shape[-1]).t()
        with _on(side):  # the low-rank path's small matmuls (and the selector's, with z) beside dW = u^T dy
            de = dy.t() @ c if need_e else None
            dc = dy @ e_w  # [B, c]
            dcw = dc.t() @ v if need_c else None
            dv = dc @ c_w
            ds = selector_gradient(x, s, p, dv, z, dy) if z is not None else None
        _join(side)
        if z is not None:  # x needs no gradient: the selector's alone, from z
            return None, ds, dw, dcw, de
        dx, ds = select_scale_backward(x, s, p, du, dv, False)
        return dx if need_x else None, ds if need_s else None, dw, dcw, de


_SIDE_STREAMS: dict = {}  # one high-priority side stream per device, reused


def _fork(t: torch.Tensor):
    """A side stream that waits for the current one while a CUDA graph is being captured, so that small
    latency-bound kernels run beside a bandwidth-bound one instead of after it; None otherwise. Eager
    steps stay on one stream: an eager step of this layer is host-bound on an H200 host (its host time
    per forward + backward exceeds the GPU time), so overlap would save GPU time the step does not
    spend, while the stream switches and event waits add host calls; a graph pays those once, at
    capture. While torch.compile traces, inductor orders the graph."""
    if not t.is_cuda or torch.compiler.is_compiling() or not torch.cuda.is_current_stream_capturing():
        return None
    side = _SIDE_STREAMS.get(t.device)
    if side is None:  # high priority: its blocks take SMs as the big kernel's free up
        side = _SIDE_STREAMS[t.device] = torch.cuda.Stream(t.device, priority=-1)
    side.wait_stream(torch.cuda.current_stream(t.device))
    return side


def _on(side):
    return torch.cuda.stream(side) if side is not None else contextlib.nullcontext()


def _join(side) -> None:
    """The current stream waits for the side stream's work (every tensor made there is then safe to use,
    and the side stream's next fork orders its reuse of their memory after this stream's reads)."""
    if side is not None:
        torch.cuda.current_stream(side.device).wait_stream(side)


class SelectScale(torch.autograd.Function):
    """(u, v, idx) = (x * p, x * (1 - p), argmax) with p the soft or hard selection over fragments,
    in one kernel (kernels/fragmented.py), and its backward in one or two (see that module); for the
    hard selection p is constant (argmax has no gradient), as in the reference, so S gets none."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, s: torch.Tensor, hard: bool):
        u, v, p, idx = select_scale(x, s, hard)
        ctx.hard = hard
        ctx.save_for_backward(x, s, p)
        ctx.mark_non_differentiable(idx)
        return u, v, idx

    @staticmethod
    def backward(ctx, du, dv, _):
        x, s, p = ctx.saved_tensors
        du = torch.zeros_like(x) if du is None else du
        dv = torch.zeros_like(x) if dv is None else dv
        dx, ds = select_scale_backward(x, s, p, du, dv, ctx.hard)
        return dx, (None if ctx.hard else ds), None


class GroupedExperts(torch.autograd.Function):
    """y[b] = x_{idx_b} @ W[idx_b] for x [B, in], idx [B], W [N, F, out] -> [B, out].

    Forward: sort rows by fragment, gather each row's selected slice [B, F], one grouped GEMM.
    Backward: dW = (x masked to its fragment)^T @ dy and dx = (dy @ W^T) masked: two dense matmuls
    of the sizes a dense Linear's backward has, so no per-sample weight is ever materialised."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        b, n = x.shape[0], w.shape[0]
        order = torch.argsort(idx, stable=True)
        rows = x.view(b, n, w.shape[1])[order, idx[order]]  # [B, F], sorted by fragment
        counts = torch.zeros(n, dtype=torch.int64, device=x.device)
        counts.index_add_(0, idx, torch.ones_like(idx))  # bincount without a device sync
        offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        y_sorted = grouped_matmul(rows, w, offsets)
        ctx.save_for_backward(x, idx, w)
        # rows back in batch order, out of place: order is a permutation, so every row is overwritten.
        # Returned from an in-place index_copy_ on a new tensor, the output reached backward with a zero
        # gradient under torch.compile in torch 2.11 (dW came out zero; eager and torch 2.13 were right).
        return y_sorted.index_copy(0, order, y_sorted)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, idx, w = ctx.saved_tensors
        n, f, out = w.shape
        sel = (idx[:, None] == torch.arange(n, device=idx.device)).to(x.dtype)[:, :, None]
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = ((dy @ w.view(n * f, out).t()).view(-1, n, f) * sel).view(x.shape)
        if ctx.needs_input_grad[2]:
            dw = ((x.view(-1, n, f) * sel).view(x.shape).t() @ dy).view(n, f, out)
        return dx, None, dw


class BlockDiagonalLinear(nn.Module):
    """N independent blocks: y_n = x_n @ W_n, W [N, in/N, out/N]; in*out/N parameters."""

    def __init__(self, in_features: int, out_features: int, num_blocks: int, bias: bool = False,
                 *, device=None, dtype=None):
        super().__init__()
        _check_positive(in_features=in_features, out_features=out_features, num_blocks=num_blocks)
        if in_features % num_blocks or out_features % num_blocks:
            raise ValueError(f"{num_blocks} blocks must divide both {in_features} and {out_features}")
        self.num_blocks = num_blocks
        fi, fo = in_features // num_blocks, out_features // num_blocks
        self.weight = nn.Parameter(torch.randn(num_blocks, fi, fo, device=device, dtype=dtype) / math.sqrt(fi))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        xb = x.view(b, self.num_blocks, -1).transpose(0, 1)  # [N, B, in/N]
        y = torch.bmm(xb, self.weight).transpose(0, 1).reshape(b, -1)  # [B, out]
        return y if self.bias is None else y + self.bias


class LowRankLinear(nn.Module):
    """x -> up(down(x)) with rank r: (in + out) * r parameters (the layer's own low-rank path)."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = False,
                 *, device=None, dtype=None):
        super().__init__()
        _check_positive(in_features=in_features, out_features=out_features, rank=rank)
        self.down = nn.Linear(in_features, rank, bias=False, device=device, dtype=dtype)
        self.up = nn.Linear(rank, out_features, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))


def fragmented_parameter_count(in_features: int, out_features: int, compressed: int | None = None,
                               bias: bool = False) -> int:
    """The reference formula: in + in*out + in*c + c*out (+ 2*out biases), c = in/32 by default."""
    c = in_features // 32 if compressed is None else compressed
    return in_features + in_features * out_features + in_features * c + c * out_features + 2 * out_features * bias


def reference_output(layer: FragmentedLinear, x: torch.Tensor, hard: bool) -> torch.Tensor:
    """The reference definition in float64, directly: einsum over fragments (soft) or each sample's
    own W_{f*} (hard, gathered in chunks of samples to bound memory). Returns [B, out] float64."""
    n, fs = layer.num_fragments, layer.fragment_size
    xd = x.detach().double().reshape(-1, layer.in_features)
    xf = xd.view(-1, n, fs)
    w = layer.expert_weights.detach().double()
    p = torch.softmax(torch.einsum("bfi,fi->bf", xf, layer.selector_weights.detach().double()), dim=1)
    if hard:
        idx = p.argmax(dim=1)
        chunk = max(1, (1 << 25) // (fs * layer.out_features))  # at most 256 MB of gathered fp64 weights
        expert = torch.cat([torch.einsum("bi,bio->bo", xf[s:s + chunk].gather(
            1, idx[s:s + chunk, None, None].expand(-1, 1, fs))[:, 0], w[idx[s:s + chunk]])
            for s in range(0, xd.shape[0], chunk)])
        keep = torch.ones_like(p).scatter_(1, idx[:, None], 0.0)
    else:
        expert = torch.einsum("bfi,fio,bf->bo", xf, w, p)
        keep = 1 - p
    masked = (xf * keep[:, :, None]).reshape(xd.shape)
    low = masked @ layer.compressor.weight.detach().double().t() @ layer.compressed_net.weight.detach().double().t()
    out = expert + low
    if layer.has_bias:
        out = out + layer.expert_bias.detach().double() + layer.compressed_bias.detach().double()
    return out
