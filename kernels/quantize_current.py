"""Current (tensorwise) scaling of a 2-D BF16 tensor to E4M3, plus the transposed E4M3 copy that Hopper's
TN-only FP8 GEMMs need for the backward pass, in one launch.

Two passes over the data, the fewest the math allows (every element's cast needs the whole tensor's amax), in
one persistent kernel (`_current_cast_kernel`) whose programs all run at once:
1. each program reduces its share of the tiles to max|x| in registers and folds it into the grid's amax with one
   atomic max (non-negative floats order as their int32 bits do);
2. a grid-wide barrier: each program counts itself in and waits until every program has;
3. each program computes scale = 448 / max(amax, 1e-12) in float32 the way torch evaluates it (reciprocal, then
   multiply; fp8bench's emulator and torchao do the same), loads each of its tiles again, scales it, rounds to
   E4M3 (ties to even, saturating) and stores it twice, row-major (Y) and column-major (Yᵀ). Program 0 writes
   the inverse scale; the last program to finish zeroes the barrier's scratch for the next launch.
Bytes moved: read X twice (2 x 2 bytes/element), write Y and Yᵀ (2 x 1 byte).

Why one launch: as two kernels (an amax pass writing per-program partial maxes, then the cast) plus four
allocations, a call costs the host more time than both kernels take at a training step's sizes, so an eager
call runs at the host's pace, well below what the same kernels replayed from a CUDA graph reach
(docs/kernels.md). One launch is one call of three allocations (Y, Yᵀ, the inverse scale); the barrier's three counters
live in a scratch buffer kept per device and stream, zeroed once when made (under CUDA-graph capture, one per
captured call, zeroed in the graph).

The barrier needs every program resident at once. The grid is therefore at most what the compiled kernel's
registers and shared memory let the SMs hold (computed from the binary on a key's first call), and the kernel
is launched cooperatively (`launch_cooperative_grid`), so CUDA refuses a grid that could not all be resident
rather than letting it hang; a `programs` larger than that is refused before the launch, with the most the binary
allows (how many fit depends on the specialization: see `_capacity`). Under Triton's interpreter programs run one after another, so there the grid is one
program (its loops still cover every tile).

`quantize_current_reference` is the same contract in plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._fp8 import AMAX_EPS, E4M3_MAX, e4m3_scale, exact_rcp, scale_to_e4m3
from ._launch import Launcher, cast_key, cdiv, sm_count
from ._tune import INTERPRETING

CONFIGS = [
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "per_sm": 2, "reverse": True},
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "per_sm": 2, "reverse": False},
    {"BLOCK_M": 64, "BLOCK_N": 256, "num_warps": 8, "per_sm": 2, "reverse": True},
    {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4, "per_sm": 4, "reverse": False},
    {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 4, "per_sm": 4, "reverse": False},
    {"BLOCK_M": 64, "BLOCK_N": 256, "num_warps": 8, "per_sm": 2, "reverse": False},
]
"""The tile, warps, programs per SM (at most: fewer where the binary's registers or shared memory do not let
that many share an SM) and the order of the second pass (`reverse`: each program's tiles last to first, so the
tiles it read last in the first pass, the likeliest still in the L2, come first). CONFIGS[0] is the default:
timed device-only, the fastest or within a hair of it at the cast line's shapes, faster than the same config
in forward order and than the two-launch form up to the largest shapes (docs/kernels.md)."""

SYNC_WORDS = 4
"""The barrier's scratch (int32): the amax's bits, programs arrived, programs done, padding."""


@triton.jit
def load_tile(x_ptr, tile_m, tile_n, M, N, stride_m, stride_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """X's tile (tile_m, tile_n), zero past the edges: (its rows, its columns, the in-bounds mask, the values)."""
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_n, mask=mask, other=0.0)
    return rows, cols, mask, x


@triton.jit
def store_both(y_ptr, yt_ptr, rows, cols, mask, q, M, N, TRANSPOSE: tl.constexpr):
    """A quantized tile into Y [M, N] row-major and, with TRANSPOSE, into Yᵀ [N, M]."""
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], q, mask=mask)
    if TRANSPOSE:
        tl.store(yt_ptr + cols[:, None] * M + rows[None, :], tl.trans(q), mask=tl.trans(mask))


@triton.jit
def _current_cast_kernel(x_ptr, y_ptr, yt_ptr, inv_scale_ptr, sync_ptr, M, N, stride_m, stride_n,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TRANSPOSE: tl.constexpr,
                         REVERSE: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    n_tiles = tl.cdiv(M, BLOCK_M) * tiles_n

    # pass 1: this program's tiles (a grid-stride loop) to one max, folded into the grid's
    best = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(pid, n_tiles, programs):
        _, _, _, x = load_tile(x_ptr, t // tiles_n, t % tiles_n, M, N, stride_m, stride_n, BLOCK_M, BLOCK_N)
        best = tl.maximum(best, tl.abs(x.to(tl.float32)))
    own_max = tl.max(tl.max(best, axis=1), axis=0)
    tl.atomic_max(sync_ptr, own_max.to(tl.int32, bitcast=True))

    # the barrier: count in (release: the max above is visible first), wait for the rest (acquire)
    tl.atomic_add(sync_ptr + 1, 1, sem="release")
    arrived = tl.atomic_add(sync_ptr + 1, 0, sem="acquire")
    while arrived < programs:
        arrived = tl.atomic_add(sync_ptr + 1, 0, sem="acquire")
    amax = tl.atomic_add(sync_ptr, 0, sem="acquire").to(tl.float32, bitcast=True)

    # pass 2: the same tiles again, scaled and stored in both layouts
    scale = e4m3_scale(amax)
    if pid == 0:
        tl.store(inv_scale_ptr, exact_rcp(scale))
    mine = tl.cdiv(n_tiles - pid, programs)  # this program's tiles (none where pid >= n_tiles)
    for i in range(0, mine):
        # REVERSE: the tiles last read in pass 1 first, while the L2 may still hold them
        t = pid + ((mine - 1 - i) if REVERSE else i) * programs
        rows, cols, mask, x = load_tile(x_ptr, t // tiles_n, t % tiles_n, M, N, stride_m, stride_n, BLOCK_M,
                                        BLOCK_N)
        store_both(y_ptr, yt_ptr, rows, cols, mask, scale_to_e4m3(x.to(tl.float32), scale), M, N, TRANSPOSE)

    # every program has read the amax before it counts itself done: the last one zeroes the scratch
    done = tl.atomic_add(sync_ptr + 2, 1, sem="acq_rel")
    if done == programs - 1:
        tl.store(sync_ptr, 0)
        tl.store(sync_ptr + 1, 0)
        tl.store(sync_ptr + 2, 0)


_launch_cast = Launcher(_current_cast_kernel)
_scratch: dict[tuple[str, int, int], torch.Tensor] = {}
_resident: dict[tuple, int] = {}
_capacities: dict[tuple, int] = {}


def scratch_key(device: torch.device) -> tuple[str, int, int]:
    """Whose counters a call outside graph capture uses: the device and its current stream (0 off CUDA)."""
    index = device.index or 0
    return device.type, index, torch._C._cuda_getCurrentRawStream(index) if device.type == "cuda" else 0


def _sync_scratch(device: torch.device) -> torch.Tensor:
    """The barrier's counters for the current stream of `device`: two streams casting at once must not share
    them (each launch leaves them zeroed, so one stream's launches may). Under CUDA-graph capture each captured
    call gets counters of its own, zeroed in the graph before its launch, since graphs may be replayed on any
    stream, together."""
    if device.type == "cuda" and torch._C._cuda_isCurrentStreamCapturing():  # torch.cuda.is_current_stream_capturing
        return torch.zeros(SYNC_WORDS, device=device, dtype=torch.int32)
    key = scratch_key(device)
    scratch = _scratch.get(key)
    if scratch is None:
        scratch = _scratch[key] = torch.zeros(SYNC_WORDS, device=device, dtype=torch.int32)
    return scratch


def programs_resident(compiled, num_warps: int, device: torch.device) -> int:
    """How many programs of `compiled` (a loaded CompiledKernel) one SM holds at once: the fewest that its
    registers (allocated per warp in units of 256), shared memory (plus the 1 KB the runtime reserves per block
    from sm_80 on) or threads allow."""
    props = torch.cuda.get_device_properties(device)
    registers = triton.runtime.driver.active.utils.get_device_properties(device.index)["max_num_regs"]
    regs_per_warp = cdiv(max(compiled.n_regs, 1) * 32, 256) * 256
    by_regs = registers // (regs_per_warp * num_warps)
    by_smem = props.shared_memory_per_multiprocessor // (compiled.metadata.shared + 1024)
    by_threads = props.max_threads_per_multi_processor // (32 * num_warps)
    return max(1, min(by_regs, by_smem, by_threads, 32))


def _capacity(key: tuple, config: dict, args: tuple, constants: dict) -> int:
    """How many programs of a key's binary the GPU holds at once (found on the key's first call, from the
    compiled registers and shared memory): the largest grid the barrier can wait on. The binary depends on the
    call's specialization: at shapes whose M or N is not a multiple of 16 ptxas gives CONFIGS[0] about twice
    the registers it gives where both are (sm_90), one 8-warp program per SM instead of two."""
    capacity = _capacities.get(key)
    if capacity is None:
        compiled = _current_cast_kernel.warmup(*args, grid=(1,), **constants)
        compiled._init_handles()  # loads the binary: its register count is known from here
        device = args[0].device
        capacity = _capacities[key] = programs_resident(compiled, config["num_warps"], device) * sm_count(device)
    return capacity


def _default_grid(key: tuple, config: dict, args: tuple, constants: dict) -> int:
    """A key's default grid, found on its first call: as many programs as the SMs hold of the compiled binary at
    once, at most the config's per SM, at most one per tile; one under the interpreter."""
    m, n = args[5:7]
    tiles = cdiv(m, config["BLOCK_M"]) * cdiv(n, config["BLOCK_N"])
    if INTERPRETING:
        return 1
    per_sm_cap = config["per_sm"] * sm_count(args[0].device)
    grid = _resident[(key, config["per_sm"])] = max(1, min(tiles, per_sm_cap, _capacity(key, config, args, constants)))
    return grid


def quantize_current(x: torch.Tensor, transpose: bool = True, programs: int | None = None,
                     config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(Y [M, N] E4M3, Yᵀ [N, M] E4M3 contiguous or None, inverse scale: float32 scalar tensor), one launch.
    `programs`: the persistent grid (default: as many as can be resident, at most the config's per SM, at most
    one per tile; under the interpreter one; a grid that cannot all be resident is refused with a ValueError); `config`: one of CONFIGS (default CONFIGS[0])."""
    if x.dim() != 2:
        raise ValueError(f"quantize_current takes a 2-D tensor, got shape {tuple(x.shape)}")
    if programs is not None and programs < 1:
        raise ValueError(f"quantize_current needs programs >= 1, got {programs}")
    if INTERPRETING and programs not in (None, 1):
        raise ValueError("under Triton's interpreter programs run one after another: the grid-wide barrier "
                         f"needs programs=1, got {programs}")
    if x.numel() >= 2**31:  # the kernel's offsets are int32
        raise ValueError(f"quantize_current takes fewer than 2^31 elements, got shape {tuple(x.shape)}")
    config = config or CONFIGS[0]
    device, (m, n) = x.device, x.shape
    block_m, block_n, warps = config["BLOCK_M"], config["BLOCK_N"], config["num_warps"]
    inv_scale = torch.empty((), device=device, dtype=torch.float32)
    y = torch.empty((m, n), device=device, dtype=torch.float8_e4m3fn)
    yt = torch.empty((n, m), device=device, dtype=torch.float8_e4m3fn) if transpose else y
    args = (x, y, yt, inv_scale, _sync_scratch(device), m, n, x.stride(0), x.stride(1))
    reverse = config.get("reverse", False)
    constants = {"BLOCK_M": block_m, "BLOCK_N": block_n, "TRANSPOSE": transpose, "REVERSE": reverse,
                 "num_warps": warps}
    if not INTERPRETING:  # an option the interpreter does not take
        constants["launch_cooperative_grid"] = True
    key = cast_key(x, args[5:], transpose, block_m, block_n, warps, reverse)
    if programs is None:
        programs = _resident.get((key, config["per_sm"])) or _default_grid(key, config, args, constants)
    elif not INTERPRETING and programs > sm_count(device) and programs > (capacity := _capacity(key, config, args,
                                                                                                 constants)):
        # (one program per SM fits any binary that launches at all: a smaller grid needs no compile to check)
        # the cooperative launch would refuse it with a CUDA error; say why instead
        raise ValueError(f"quantize_current: programs={programs} cannot all be resident at once (the grid-wide "
                         f"barrier waits on every one): at most {capacity} of this binary at shape {m}x{n}")
    _launch_cast.launch(key, (programs,), args, constants)
    return y, (yt if transpose else None), inv_scale


def quantize_current_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scale = E4M3_MAX / torch.clamp(x.float().abs().amax(), min=AMAX_EPS)
    y = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return y, y.t().contiguous(), scale.reciprocal()


def bytes_moved(x: torch.Tensor) -> int:
    """What the algorithm must move: read X for the amax and again for the cast, write Y and Yᵀ."""
    return 2 * x.numel() * x.element_size() + 2 * x.numel()


def compile_sm90(config: dict):
    """The kernel at `config` compiled for sm_90 without a GPU, specialized as a launch specializes it (X with
    unit stride along N), for the ptxas check of tests/kernels/test_sm90.py."""
    from ._sm90 import compile_cast_sm90

    signature = {"x_ptr": "*bf16", "y_ptr": "*fp8e4nv", "yt_ptr": "*fp8e4nv", "inv_scale_ptr": "*fp32",
                 "sync_ptr": "*i32", **dict.fromkeys(("M", "N", "stride_m", "stride_n"), "i32")}
    constants = {"BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "TRANSPOSE": True,
                 "REVERSE": config.get("reverse", False), "stride_n": 1}
    return compile_cast_sm90(_current_cast_kernel, signature, constants, config["num_warps"])
