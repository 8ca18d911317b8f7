"""FragmentedLinear's backward at skinny batches (B <= MAX_ROWS): the weight gradients and the low-rank path.

Shapes: u = x scaled by p [B, in], dy [B, out], the low-rank path c = v C^T [B, r] (v = x scaled by 1 - p
[B, in], C [r, in]) and y += c E^T (E [out, r]).

- `expert_weight_grad(u, dy)`: dW = u^T dy [in, out]. At such batches an outer product of rank B that writes
  as many bytes as W has and reads next to nothing, run as a persistent kernel that streams tiles of dW out
  (on an H200, bf16, 8192 x 8192, B = 16: 35.8 us against 46.0 us for cuBLAS's u^T @ dy, probe).
- `expert_backward(u, dy, c, E)`: the same pass also forms the low-rank path's dE = dy^T c [out, r] and
  dc = dy E [B, r] (fp32): the programs that hold the first rows of dW tiles read column blocks of dy
  anyway, so they add those columns' share of both, one rank chunk per row of tiles (the rows' tiles fall
  on different programs: the extra work is spread). dc sums the shares with fp32 atomics, so its last
  bits depend on their order; under torch.use_deterministic_algorithms(True) the torch reference runs.
- `low_rank_input_grad(dc, C, v)`: dv = dc C [B, in] and dC = dc^T v [r, in] in one pass over C, dc rounded
  to v's dtype first (as the unfused dc = dy E would be).
Together they replace four small cuBLAS matmuls (five kernels), which ran one after another after dW (about 30 us of
latency-bound kernels per graphed step on an H200, probe), with work inside dW's pass and one light pass.
Each has a torch reference (same math); devices Triton cannot run on, and larger batches, use it. Eager
calls replay compiled kernels per shape; under torch.compile these are custom ops.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import (
    cdiv,
    dot_accumulate,
    dot_rows,
    fp32_tile_limit,
    ieee,
    interpreting,
    is_compiling,
    register_op,
    upcast,
    use_triton,
)
from kernels._common.launch import LaunchCache, aligned, config_dict

MAX_ROWS = 64  # the batches these kernels serve (rows summed per dW tile in chunks of 16)


@triton.jit
def _low_rank_share(dy_ptr, c_ptr, e_ptr, de_ptr, dc_ptr, rn, r0, B, OUT, R, stride_dy, stride_c,
                    IEEE: tl.constexpr, UPCAST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
                    BLOCK_R: tl.constexpr):
    """For the dy columns rn [BLOCK_N] and the rank chunk r0 + [0, BLOCK_R): dE[rn, chunk] = dy[:, rn]^T c[:, chunk],
    and dc[:, chunk] += dy[:, rn] E[rn, chunk] (fp32 atomics)."""
    chunk = tl.arange(0, BLOCK_B)
    col_in = rn < OUT
    rr = r0 + tl.arange(0, BLOCK_R)
    r_in = rr < R
    e = tl.load(e_ptr + rn[:, None].to(tl.int64) * R + rr[None, :], mask=col_in[:, None] & r_in[None, :],
                other=0.0)  # E tile [BLOCK_N, BLOCK_R]
    de = tl.zeros([BLOCK_N, BLOCK_R], dtype=tl.float32)
    for b0 in range(0, B, BLOCK_B):
        rb = b0 + chunk
        row_in = rb < B
        d = tl.load(dy_ptr + rb[:, None].to(tl.int64) * stride_dy + rn[None, :],
                    mask=row_in[:, None] & col_in[None, :], other=0.0)  # [BLOCK_B, BLOCK_N]
        cc = tl.load(c_ptr + rb[:, None].to(tl.int64) * stride_c + rr[None, :],
                     mask=row_in[:, None] & r_in[None, :], other=0.0)  # [BLOCK_B, BLOCK_R]
        de = dot_accumulate(tl.trans(d), cc, de, IEEE, UPCAST)
        share = dot_accumulate(d, e, tl.zeros([BLOCK_B, BLOCK_R], dtype=tl.float32), IEEE, UPCAST)
        tl.atomic_add(dc_ptr + rb[:, None] * R + rr[None, :], share, mask=row_in[:, None] & r_in[None, :],
                      sem="relaxed")
    tl.store(de_ptr + rn[:, None].to(tl.int64) * R + rr[None, :], de.to(de_ptr.dtype.element_ty),
             mask=col_in[:, None] & r_in[None, :])


@triton.jit
def _weight_grad_kernel(u_ptr, dy_ptr, dw_ptr, c_ptr, e_ptr, de_ptr, dc_ptr, B, IN, OUT, R, stride_u, stride_dy,
                        stride_c, PROGRAMS: tl.constexpr, LOW_RANK: tl.constexpr, IEEE: tl.constexpr,
                        UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
                        BLOCK_R: tl.constexpr):
    """dW [IN, OUT] = u^T dy: PROGRAMS programs walk the [BLOCK_M, BLOCK_N] tiles of dW in row-major order
    (neighbouring programs write neighbouring columns), each tile a sum over B in BLOCK_B row chunks; with
    LOW_RANK the tiles of row k also add their columns' share of dE and dc for rank chunks k, k + rows, ...
    (_low_rank_share): the first rows' tiles fall on different programs, so the extra work is spread."""
    tiles_n = tl.cdiv(OUT, BLOCK_N)
    rows = tl.cdiv(IN, BLOCK_M)
    tiles = rows * tiles_n
    chunk = tl.arange(0, BLOCK_B)
    for t in tl.range(tl.program_id(0), tiles, PROGRAMS):
        rm = (t // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = (t % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for b0 in range(0, B, BLOCK_B):
            rb = b0 + chunk
            a = tl.load(u_ptr + rb[None, :].to(tl.int64) * stride_u + rm[:, None],
                        mask=(rb[None, :] < B) & (rm[:, None] < IN), other=0.0)  # u^T tile [BLOCK_M, BLOCK_B]
            d = tl.load(dy_ptr + rb[:, None].to(tl.int64) * stride_dy + rn[None, :],
                        mask=(rb[:, None] < B) & (rn[None, :] < OUT), other=0.0)
            acc = dot_accumulate(a, d, acc, IEEE, UPCAST)
        tl.store(dw_ptr + rm[:, None].to(tl.int64) * OUT + rn[None, :], acc.to(dw_ptr.dtype.element_ty),
                 mask=(rm[:, None] < IN) & (rn[None, :] < OUT))
        if LOW_RANK:
            for r0 in range((t // tiles_n) * BLOCK_R, R, rows * BLOCK_R):
                _low_rank_share(dy_ptr, c_ptr, e_ptr, de_ptr, dc_ptr, rn, r0, B, OUT, R, stride_dy, stride_c, IEEE,
                                UPCAST, BLOCK_N, BLOCK_B, BLOCK_R)


# (BLOCK_M, BLOCK_N, num_warps): the probe's fastest tiles for the bf16 8192 x 8192 case, two programs per SM
_GRAD_CONFIGS = [(64, 128, 4), (64, 128, 8), (128, 128, 4), (128, 128, 8), (64, 256, 4)]
_GRAD_PROGRAMS_PER_SM = 2
_BLOCK_B, _BLOCK_R = 16, 64


def _autotuner(**extra):
    prune = fp32_tile_limit("u_ptr", ("BLOCK_M", "BLOCK_N"))
    return triton.autotune(
        configs=[triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_stages=2, num_warps=w) for m, n, w in _GRAD_CONFIGS],
        key=["B", "IN", "OUT", "R"], prune_configs_by={"early_config_prune": prune}, **extra,
    )(_weight_grad_kernel)


_grad_autotuned = _autotuner()
_backward_autotuned = _autotuner(reset_to_zero=["dc_ptr"])  # each timed trial starts dc from zero
_INTERPRETER_GRAD = (32, 32, 3)  # (BLOCK_M, BLOCK_N, programs): a few programs, each walking several tiles
_GRAD_LAUNCHES = LaunchCache("expert_weight_grad")
_BACKWARD_LAUNCHES = LaunchCache("expert_backward")


def _skinny(*tensors) -> bool:
    """True when the kernels take these [B, *] operands: B <= MAX_ROWS, unit column stride, one dtype."""
    b = tensors[0].shape[0]
    return (use_triton(*tensors) and 0 < b <= MAX_ROWS and all(t.stride(1) == 1 for t in tensors)
            and len({t.dtype for t in tensors}) == 1)


def _launch_grad(cache: LaunchCache, autotuned, args: tuple, low_rank: bool, dtype, device, key: tuple) -> None:
    """Launch _weight_grad_kernel on args (runtime arguments in signature order) through cache."""
    def first():
        flags = (ieee(dtype), upcast(dtype))
        if interpreting():
            block_m, block_n, programs = _INTERPRETER_GRAD
            consts = (programs, low_rank, *flags, block_m, block_n, _BLOCK_B, _BLOCK_R)
            compiled = _weight_grad_kernel[(programs,)](*args, *consts)
            return compiled, (programs,), consts, {"BLOCK_M": block_m, "BLOCK_N": block_n, "PROGRAMS": programs}
        programs = _GRAD_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
        compiled = autotuned[(programs,)](*args, programs, low_rank, *flags, BLOCK_B=_BLOCK_B, BLOCK_R=_BLOCK_R)
        best = autotuned.best_config
        consts = (programs, low_rank, *flags, best.kwargs["BLOCK_M"], best.kwargs["BLOCK_N"], _BLOCK_B, _BLOCK_R)
        if low_rank:  # the autotuner's trials added to dc: zero it and run the chosen config once more
            args[6].zero_()
            compiled[(programs, 1, 1)](*args, *consts)
        return compiled, (programs,), consts, {**config_dict(best), "PROGRAMS": programs, "BLOCK_B": _BLOCK_B}

    cache.launch(key, args, first)


def _expert_weight_grad(u: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    if not _skinny(u, dy):
        return expert_weight_grad_reference(u, dy)
    (b, n_in), out = u.shape, dy.shape[1]
    dw = torch.empty((n_in, out), dtype=dy.dtype, device=dy.device)
    args = (u, dy, dw, dw, dw, dw, dw, b, n_in, out, 0, u.stride(0), dy.stride(0), 0)  # no low-rank operands
    key = (b, n_in, out, u.stride(0), dy.stride(0), u.dtype, aligned(u, dy, dw), u.device)
    _launch_grad(_GRAD_LAUNCHES, _grad_autotuned, args, False, u.dtype, u.device, key)
    return dw


def _expert_backward(u: torch.Tensor, dy: torch.Tensor, c: torch.Tensor, e: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if not (_skinny(u, dy, c) and e.dtype == u.dtype and e.is_contiguous()) \
            or torch.are_deterministic_algorithms_enabled():
        return expert_backward_reference(u, dy, c, e)
    (b, n_in), (out, r) = u.shape, e.shape
    dw = torch.empty((n_in, out), dtype=dy.dtype, device=dy.device)
    de = torch.empty((out, r), dtype=dy.dtype, device=dy.device)
    dc = torch.zeros((b, r), dtype=torch.float32, device=dy.device)
    args = (u, dy, dw, c, e, de, dc, b, n_in, out, r, u.stride(0), dy.stride(0), c.stride(0))
    key = (b, n_in, out, r, u.stride(0), dy.stride(0), c.stride(0), u.dtype, aligned(u, dy, dw, c, e, de, dc),
           u.device)
    _launch_grad(_BACKWARD_LAUNCHES, _backward_autotuned, args, True, u.dtype, u.device, key)
    return dw, de, dc


@triton.jit
def _low_rank_input_kernel(dc_ptr, cw_ptr, v_ptr, dv_ptr, dcw_ptr, B, IN, R, stride_v, IEEE: tl.constexpr,
                           UPCAST: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_R: tl.constexpr):
    """For the input columns of this program: dv[:, cols] = dc C[:, cols] and dC[:, cols] = dc^T v[:, cols]."""
    rows = tl.arange(0, BLOCK_B)
    cols = tl.program_id(0) * BLOCK_J + tl.arange(0, BLOCK_J)
    row_in, col_in = rows < B, cols < IN
    v = tl.load(v_ptr + rows[:, None].to(tl.int64) * stride_v + cols[None, :], mask=row_in[:, None] & col_in[None, :],
                other=0.0)  # [BLOCK_B, BLOCK_J]
    dv = tl.zeros([BLOCK_B, BLOCK_J], dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        rr = r0 + tl.arange(0, BLOCK_R)
        r_in = rr < R
        dc = tl.load(dc_ptr + rows[:, None] * R + rr[None, :], mask=row_in[:, None] & r_in[None, :], other=0.0)
        dc = dc.to(v_ptr.dtype.element_ty)  # rounded as dc = dy E would be
        cw = tl.load(cw_ptr + rr[:, None].to(tl.int64) * IN + cols[None, :], mask=r_in[:, None] & col_in[None, :],
                     other=0.0)  # C tile [BLOCK_R, BLOCK_J]
        dv = dot_accumulate(dc, cw, dv, IEEE, UPCAST)
        dcw = dot_accumulate(tl.trans(dc), v, tl.zeros([BLOCK_R, BLOCK_J], dtype=tl.float32), IEEE, UPCAST)
        tl.store(dcw_ptr + rr[:, None].to(tl.int64) * IN + cols[None, :], dcw.to(dcw_ptr.dtype.element_ty),
                 mask=r_in[:, None] & col_in[None, :])
    tl.store(dv_ptr + rows[:, None].to(tl.int64) * IN + cols[None, :], dv.to(dv_ptr.dtype.element_ty),
             mask=row_in[:, None] & col_in[None, :])


_INPUT_BLOCK_J, _INPUT_BLOCK_R, _INPUT_WARPS = 64, 64, 4  # 128 programs at in = 8192: a light pass, not tuned
_INPUT_LAUNCHES = LaunchCache("low_rank_input_grad")


def _low_rank_input_grad(dc: torch.Tensor, cw: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not (_skinny(v) and cw.dtype == v.dtype and cw.is_contiguous() and dc.is_contiguous()
            and dc.dtype == torch.float32):
        return low_rank_input_grad_reference(dc, cw, v)
    (b, n_in), r = v.shape, cw.shape[0]
    dv = torch.empty((b, n_in), dtype=v.dtype, device=v.device)
    dcw = torch.empty((r, n_in), dtype=v.dtype, device=v.device)
    args = (dc, cw, v, dv, dcw, b, n_in, r, v.stride(0))
    key = (b, n_in, r, v.stride(0), v.dtype, aligned(dc, cw, v, dv, dcw), v.device)

    def first():
        consts = (ieee(v.dtype), upcast(v.dtype), dot_rows(b), _INPUT_BLOCK_J, _INPUT_BLOCK_R)
        grid = (cdiv(n_in, _INPUT_BLOCK_J),)
        compiled = _low_rank_input_kernel[grid](*args, *consts, num_warps=_INPUT_WARPS)
        return compiled, grid, consts, {"BLOCK_J": _INPUT_BLOCK_J, "BLOCK_R": _INPUT_BLOCK_R, "BLOCK_B": consts[2],
                                        "num_warps": _INPUT_WARPS}

    _INPUT_LAUNCHES.launch(key, args, first)
    return dv, dcw


_GRAD_OP = register_op("expert_weight_grad", _expert_weight_grad,
                       lambda u, dy: u.new_empty((u.shape[1], dy.shape[1])))
_BACKWARD_OP = register_op("expert_backward", _expert_backward,
                           lambda u, dy, c, e: (u.new_empty((u.shape[1], dy.shape[1])), e.new_empty(e.shape),
                                                c.new_empty(c.shape, dtype=torch.float32)))
_INPUT_OP = register_op("low_rank_input_grad", _low_rank_input_grad,
                        lambda dc, cw, v: (v.new_empty(v.shape), cw.new_empty(cw.shape)))


def expert_weight_grad(u: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dW [in, out] = u^T dy for u [B, in], dy [B, out] (one dtype); see the module docstring."""
    return _GRAD_OP(u, dy) if is_compiling() else _expert_weight_grad(u, dy)


def expert_backward(u: torch.Tensor, dy: torch.Tensor, c: torch.Tensor, e: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dW [in, out] = u^T dy, dE [out, r] = dy^T c, dc [B, r] = dy E in fp32); see the module docstring."""
    return _BACKWARD_OP(u, dy, c, e) if is_compiling() else _expert_backward(u, dy, c, e)


def low_rank_input_grad(dc: torch.Tensor, cw: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dv [B, in] = dc C, dC [r, in] = dc^T v) for dc [B, r] fp32, C [r, in], v [B, in]; dc rounded to v's dtype."""
    return _INPUT_OP(dc, cw, v) if is_compiling() else _low_rank_input_grad(dc, cw, v)


# ---------------------------------------------------------------------------------------- references


def expert_weight_grad_reference(u: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    return u.t() @ dy


def expert_backward_reference(u, dy, c, e) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain torch, same math: dc accumulated in fp32 and kept in fp32."""
    dc = (dy.float() @ e.float()) if dy.dtype != torch.float32 else dy @ e
    return expert_weight_grad_reference(u, dy), dy.t() @ c, dc


def low_rank_input_grad_reference(dc, cw, v) -> tuple[torch.Tensor, torch.Tensor]:
    dcr = dc.to(v.dtype)
    return dcr @ cw, dcr.t() @ v
