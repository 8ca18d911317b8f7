"""How Triton issues the SwitchBack matmul's tensor-core instructions on Hopper, int8 against fp8: compiles
kernels/switchback_matmul_tma.py for sm_90 (no GPU needed) at the tile the autotuner keeps for large shapes
(128x256x128, 3 stages, 8 warps) and prints, per format, the wgmma instruction and how many of them the main
loop keeps in flight (`warp_group_dot_wait` pendings: 0 = each waits for the one before).

    python3 scripts/wgmma_shapes.py
"""

from __future__ import annotations

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels.switchback_matmul_tma import CONFIGS, _quantized_matmul_tma_kernel

FORMATS = {"int8": ("i8", False), "fp8 e4m3": ("fp8e4nv", True)}


def compiled(element: str, fp8: bool):
    bm, bn, bk, stages, warps = CONFIGS[0]
    signature = {"a_desc": f"tensordesc<{element}[{bm}, {bk}]>", "b_desc": f"tensordesc<{element}[{bn}, {bk}]>",
                 "c_desc": f"tensordesc<fp16[{bm}, {bn}]>", "sa_ptr": "*fp32", "sb_ptr": "*fp32", "bias_ptr": "*fp32",
                 "M": "i32", "N": "i32", "K": "i32"}
    constants = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "NUM_PROGRAMS": 132, "PER_COLUMN": True,
                 "HAS_BIAS": False, "FP8": fp8}
    signature.update(dict.fromkeys(constants, "constexpr"))
    source = ASTSource(_quantized_matmul_tma_kernel, signature, constants)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def main() -> None:
    print(f"triton {triton.__version__}, sm_90, tile {CONFIGS[0][:3]}")
    for name, (element, fp8) in FORMATS.items():
        kernel = compiled(element, fp8)
        shapes = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+)\.", kernel.asm["ptx"])))
        waits = re.findall(r"warp_group_dot_wait[^{]*\{pendings = (\d+)", kernel.asm["ttgir"])
        pendings = sorted({int(p) for p in waits})
        print(f"{name:9s} wgmma {', '.join(shapes)}; waits with {pendings} pending (max in flight in the loop: "
              f"{max(pendings)})")


if __name__ == "__main__":
    main()
