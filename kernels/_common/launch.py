"""Launch machinery shared by the kernel families: replaying compiled kernels when a launch repeats
(LaunchCache, host TMA descriptors encoded once), the autotuner picks and launch paths every run
records, and cooperative launches of kernels with a grid barrier.

The replay calls Triton's generated launcher directly, so it depends on how that launcher is laid out:
REPLAY_TRITON names the Triton versions whose layout it was written against, and on any other version
every launch goes through Triton (the plain path). Each kernel's path (replay, plain, interpreter) is
noted when its first launch is cached and stored in the run's env.json (launch_path, launch_paths), so
a Triton upgrade that changes host times shows in the record.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import triton
import triton.language as tl

from kernels._common import cdiv, device_properties, interpreting

# ------------------------------------------------------------------------------ Triton's launcher

# Triton versions (major.minor) whose generated launcher the replay calls directly: CompiledKernel.run
# taking (grid x3, stream, function, packed metadata, launch metadata, enter hook, exit hook, *args), and
# the tensor-descriptor wrapper a closure over (launcher, tensordesc_indices, tensordesc_meta) in a module
# with _BASE_ARGS_FORMAT_LEN == 13 and make_tensordesc_arg (launcher_layout). Add a version only after
# tests/test_launch.py passes on a GPU with it.
REPLAY_TRITON = ("3.6",)
REPLAY, PLAIN, INTERPRETER = "replay", "plain", "interpreter"  # how a kernel's launches ran (launch paths)


def replay_known(version: str | None = None) -> bool:
    """Whether the Triton version (the installed one by default) is in REPLAY_TRITON."""
    major_minor = ".".join((version or triton.__version__).split(".")[:2])
    return major_minor in REPLAY_TRITON


def launcher_layout(inner) -> tuple[dict, dict] | None:
    """(closure cells by name, module globals) of the descriptor wrapper Triton 3.6 puts around its raw
    launcher (CompiledKernel.run.launch), or None where `inner` is not laid out that way (another Triton,
    or a kernel without descriptors, whose launch is the raw launcher itself)."""
    code, closure = getattr(inner, "__code__", None), getattr(inner, "__closure__", None)
    if code is None or closure is None:
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in closure)))
    names = inner.__globals__
    if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= cells.keys() or \
            names.get("_BASE_ARGS_FORMAT_LEN") != 13 or "make_tensordesc_arg" not in names:
        return None
    return cells, names


# ------------------------------------------------------------------------------ repeated launches


class LaunchCache:
    """Compiled kernels by launch key, so that a launch repeated with the same shapes (a layer in a
    training loop) skips Triton's argument binding, specialization and cache lookup: measured on an
    H200 host (triton 3.6), `kernel[grid](...)` costs about 17 us of host time and the compiled
    kernel's own runner about 7 us.

    The key must fix everything Triton specializes a compiled kernel on: tensor dtypes, 16-byte
    alignment of every pointer, and the integer arguments' values (== 1, divisible by 16); launchers
    use the exact shapes and strides plus `aligned(...)` of their tensors. The first launch of a key
    goes through Triton (compiling, autotuning) and returns what later launches replay. Under the
    interpreter nothing is cached (there is no compiled kernel).
    """

    def __init__(self, name: str):
        self.name = name
        self._entries: dict[tuple, tuple] = {}

    def launch(self, key: tuple, args: tuple, first, grid: tuple | None = None) -> None:
        """args: the kernel's runtime arguments in signature order (constexprs excluded). first():
        launches through Triton and returns (compiled kernel, grid, constexpr values in signature
        order, config dict for the record). grid (three sizes): this launch's grid where it varies
        between launches of one key (a key may then fix only how Triton specializes a size, not the
        size itself); None replays the first launch's grid."""
        entry = self._entries.get(key)
        if entry is None:
            self.store(key, *first())
        elif grid is None:
            entry[0](*args)
        else:
            entry[0](*args, grid=grid)

    def entry(self, key: tuple):
        """(replay(*args), grid, constexprs, extra) stored for key, or None."""
        return self._entries.get(key)

    def store(self, key: tuple, compiled, grid: tuple, constexprs: tuple, config: dict, extra=None) -> None:
        """Remember a first launch's compiled kernel (never under the interpreter, which has none) and note
        the path its launches take."""
        if interpreting() or compiled is None:
            PICKS.note_path(self.name, INTERPRETER if interpreting() else PLAIN)
            return
        grid = tuple(grid) + (1,) * (3 - len(grid))  # the launcher takes three grid sizes
        replay, path = _replay(compiled, grid, tuple(constexprs))
        self._entries[key] = (replay, grid, tuple(constexprs), extra)
        PICKS.note_path(self.name, path)
        record_pick(self.name, key, config)


class HostDescriptor(NamedTuple):
    """What a host TMA descriptor covers: base tensor, shape and strides (elements, last stride 1) and the
    block one load or store moves. Launchers pass these to a replay, which encodes each distinct one once
    (see _descriptor_launcher); a first launch goes through Triton with `tensor_descriptor(...)` of it."""

    base: Any
    shape: tuple
    strides: tuple
    block: tuple


def tensor_descriptor(d: HostDescriptor):
    """Triton's host TensorDescriptor of d (what a launch through Triton takes)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(d.base, list(d.shape), list(d.strides), list(d.block))


def _replay(compiled, grid: tuple, constexprs: tuple):
    """(replay(*args), path): the compiled kernel's own launcher on the current stream, with the arguments
    Triton's JIT passes it (runtime args, then constexprs), skipping its per-call device, stream and
    metadata lookups (path REPLAY); launch hooks (profilers) still get the path through Triton. Descriptor
    arguments come as HostDescriptor. On a Triton not in REPLAY_TRITON, and for descriptor kernels whose
    launcher cannot be read, every launch goes through Triton (path PLAIN)."""
    import torch
    from triton import knobs

    compiled._init_handles()
    run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    device = torch.cuda.current_device()
    raw_stream = torch._C._cuda_getCurrentRawStream
    g0, g1, g2 = grid
    known = replay_known()
    encoded = _descriptor_launcher(compiled) if known else None
    described = _takes_descriptors(compiled)  # then only Triton's path turns HostDescriptors into arguments
    plain = not known or (described and encoded is None)

    def through_triton(args, grid):
        args = tuple(tensor_descriptor(a) if isinstance(a, HostDescriptor) else a for a in args)
        return compiled[grid or (g0, g1, g2)](*args, *constexprs)

    def replay(*args, grid=None):
        if plain or _hooked(knobs.runtime):
            return through_triton(args, grid)
        if encoded is not None:
            return encoded(grid or (g0, g1, g2), raw_stream(device), args, constexprs)
        if grid is None:
            run(g0, g1, g2, raw_stream(device), function, meta, None, None, None, *args, *constexprs)
        else:
            run(*grid, raw_stream(device), function, meta, None, None, None, *args, *constexprs)

    return replay, PLAIN if plain else REPLAY


def _takes_descriptors(compiled) -> bool:
    """Whether the kernel's signature has a tensor-descriptor argument (read once per launch key, so that
    replays of every other kernel pay nothing for descriptors); True where the signature cannot be read."""
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    if not isinstance(signature, dict):
        return True
    return any(str(kind).startswith("tensordesc") for kind in signature.values())


ENCODED_PER_POSITION = 64  # encoded descriptors kept per descriptor argument of a launch key (addresses recur)


def _descriptor_launcher(compiled):
    """For a kernel whose leading arguments are host TMA descriptors: launch(grid, stream, args,
    constexprs) that encodes each distinct descriptor (address, shape, strides, block) once and calls the
    launcher beneath Triton's descriptor wrapper, which otherwise re-encodes every descriptor on every
    launch (a driver call and Python per descriptor: on an H200 host the int8 TMA matmul cost 25 us more
    host time per launch than the pointer kernel). The encoding depends on nothing else, so a cached one
    equals a fresh one; a training loop's tensors come back at the same addresses. None where the
    launcher is not laid out as triton 3.6 lays it out (launcher_layout; the path through Triton then)."""
    layout = launcher_layout(getattr(compiled.run, "launch", None))
    if layout is None:
        return None
    cells, names = layout
    count, metas = len(cells["tensordesc_indices"]), cells["tensordesc_meta"]
    run = compiled.run
    if (cells["tensordesc_indices"] != set(range(count)) or not metas or None in metas
            or run.global_scratch_size or run.profile_scratch_size):
        return None
    raw, make, function, meta = cells["launcher"], names["make_tensordesc_arg"], compiled.function, \
        compiled.packed_metadata
    cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl
    caches: list[dict] = [{} for _ in range(count)]

    def encode(d: HostDescriptor, position: int) -> tuple:
        key = (d.base.data_ptr(), d.shape, d.strides, d.block, d.base.dtype)
        cache = caches[position]
        found = cache.get(key)
        if found is None:
            if len(cache) >= ENCODED_PER_POSITION:
                cache.clear()
            found = cache[key] = tuple(make(tensor_descriptor(d), metas[position]))
        return found

    def launch(grid, stream, args, constexprs):
        expanded = [v for i in range(count) for v in encode(args[i], i)]
        raw(*grid, stream, function, cooperative, pdl, None, None, meta, None, None, None, *expanded,
            *args[count:], *constexprs)

    return launch


def _hooked(runtime) -> bool:
    """Whether a launch hook (a profiler's) is set. Triton before 3.5 keeps None or a function; later
    versions keep a HookChain whose `calls` list is empty when nothing is hooked (testing it against None
    sent every replay down Triton's own launch path)."""
    enter, exit_ = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(exit_, "calls", exit_))


def specialization(n: int) -> tuple:
    """What Triton specializes an integer argument on (its value 1, divisibility by 16, 64-bit range):
    the launch-key part of a size that varies between launches of one compiled kernel."""
    return n == 1, n % 16 == 0, n >= 2**31


def aligned(*tensors) -> bool:
    """True when every tensor's data pointer is 16-byte aligned (what Triton specializes on)."""
    bits = 0
    for t in tensors:
        if t is not None:
            bits |= t.data_ptr()
    return bits % 16 == 0


class _PickLog:
    """The configurations kernels launched with, per (kernel, launch key): the latest pick, with the
    sequence number of its note, so that a run writer can take exactly the picks made while it was
    open (qbench.env.autotune_mark / autotune_picks read this log)."""

    def __init__(self) -> None:
        self.seq = 0
        self.picks: dict[tuple[str, str], tuple[int, dict]] = {}
        self.paths: dict[str, tuple[int, str]] = {}  # kernel -> (seq, REPLAY | PLAIN | INTERPRETER | "mixed")

    def note(self, kernel: str, key, config: dict) -> None:
        key = [str(v) for v in key] if isinstance(key, tuple) else key
        self.seq += 1
        self.picks[(kernel, repr(key))] = (self.seq, {"kernel": kernel, "key": key, "config": dict(config)})

    def since(self, mark: int) -> list[dict]:
        return [pick for ident, (seq, pick) in sorted(self.picks.items()) if seq > mark]

    def note_path(self, kernel: str, path: str) -> None:
        """Note the path a kernel's launches take ("mixed" once two launch keys of it took different ones).
        Noted when a launch key is first cached (as its pick), and on every launch under the interpreter,
        which caches nothing; a run writer stores the paths noted while it is open."""
        seen = self.paths.get(kernel)
        self.seq += 1
        self.paths[kernel] = (self.seq, path if seen is None or seen[1] == path else "mixed")

    def paths_since(self, mark: int) -> dict[str, str]:
        return {kernel: path for kernel, (seq, path) in sorted(self.paths.items()) if seq > mark}


PICKS = _PickLog()


def record_pick(kernel: str, key, config: dict | None) -> None:
    """Remember the configuration a kernel launched with for one launch key (autotuner picks)."""
    if config:
        PICKS.note(kernel, key, config)


def best_tile(autotuner) -> tuple[int, int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_stages, num_warps) the autotuner picked last."""
    best = autotuner.best_config
    bm, bn, bk = (best.kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    return bm, bn, bk, best.kwargs["GROUP_M"], best.num_stages, best.num_warps


def config_dict(config) -> dict:
    """A triton.Config as a plain dict (its kwargs, num_warps, num_stages)."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


# ------------------------------------------------------------------------------ cooperative launches
# A kernel whose programs wait for each other (a grid barrier between two phases) must have every program
# resident at once: it is launched cooperatively (the driver refuses a grid that cannot be), with as many
# programs as the SMs hold.


@triton.jit
def grid_barrier(sync_ptr, programs):
    """Every program of a cooperative launch waits here for all the others. sync_ptr: int32 [2],
    (arrived, left), zero at the launch (barrier_flags); the last program to leave zeroes them for the
    next launch on the stream. Thread-block barriers around it order all threads' memory operations with
    the one thread that runs a scalar atomic (release on arrival, acquire while waiting)."""
    tl.debug_barrier()
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    while tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu") < programs:
        pass
    tl.debug_barrier()
    if tl.atomic_add(sync_ptr + 1, 1, sem="relaxed", scope="gpu") == programs - 1:
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed", scope="gpu")


BARRIERS: dict = {}  # (device, raw stream) -> int32 [2] grid-barrier flags


def barrier_flags(device):
    """The grid barrier's int32 (arrived, left) of this device and stream, zero between launches: one per
    stream, so that launches on two streams never count each other's programs."""
    import torch

    key = (device, current_stream(device))
    if key not in BARRIERS:
        BARRIERS[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return BARRIERS[key]


def current_stream(device) -> int:
    """The raw handle of the device's current stream (0 off CUDA): the key of per-stream launch state."""
    import torch

    return torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0


SCRATCH: dict = {}  # (device, raw stream, shape, dtype) -> a launch's scratch buffer


def stream_scratch(device, shape: tuple, dtype):
    """An uninitialized buffer for partial results that one launch writes and reads itself (partial maxima,
    partial sums), one per device, stream, shape and dtype: launches on one stream run in order, so each
    reuses it instead of allocating anew (a CUDA allocation costs ~7.5 us of host time on an H200 host).
    Keyed by stream as barrier_flags is, so launches on two streams never share one."""
    import torch

    key = (device, current_stream(device), shape, dtype)
    buf = SCRATCH.get(key)
    if buf is None:
        buf = SCRATCH[key] = torch.empty(shape, dtype=dtype, device=device)
    return buf


def sm_count(device) -> int:
    """Multiprocessors of a CUDA device, 2 otherwise (the interpreter: few programs, each looping)."""
    if device.type != "cuda":
        return 2
    return device_properties(device).multi_processor_count


def resident_programs(compiled, device, cap: int) -> int:
    """Programs of a compiled kernel that one SM holds at once (registers, threads, shared memory), at
    most cap."""
    props = device_properties(device)
    compiled._init_handles()
    warps = compiled.metadata.num_warps
    regs = cdiv(compiled.n_regs * 32, 256) * 256 * warps  # registers are allocated per warp, 256 at a time
    by_regs = props.regs_per_multiprocessor // max(regs, 1)
    by_threads = props.max_threads_per_multi_processor // (32 * warps)
    by_smem = props.shared_memory_per_multiprocessor // (compiled.metadata.shared + 1024)  # 1 KB kept per block
    return max(1, min(by_regs, by_threads, by_smem, cap))


def cooperative_launch(launch, programs: int):
    """(compiled kernel, grid) of launch((programs,)), with fewer programs each time the driver refuses the
    grid: a process that gets fewer SMs than the device has (MPS with a thread limit) cannot hold every
    program that `resident_programs` counts, and the driver says so rather than letting the barrier wait."""
    while True:
        try:
            return launch((programs,)), (programs,)
        except RuntimeError as exc:
            if "cooperative" not in str(exc) or programs == 1:
                raise
            programs = programs * 3 // 4


def launch_with_grid_barrier(kernel, args: tuple, consts: tuple, num_warps: int, device, cap: int):
    """(compiled kernel, grid) of the first launch of a kernel with a grid barrier: every program resident at
    once, as many as the SMs hold (at most cap per SM; cooperative_launch shrinks a refused grid). Under the
    interpreter, whose programs run one after another, one program does every item."""
    if interpreting():
        return kernel[(1,)](*args, *consts, num_warps=num_warps), (1,)
    compiled = kernel.warmup(*args, *consts, grid=(1,), num_warps=num_warps, launch_cooperative_grid=True)
    programs = sm_count(device) * resident_programs(compiled, device, cap)
    return cooperative_launch(lambda grid: kernel[grid](*args, *consts, num_warps=num_warps,
                                                        launch_cooperative_grid=True), programs)
