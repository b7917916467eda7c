"""The one timer: warm-up, per-iteration samples, median and IQR; CUDA events on GPU, perf_counter_ns on CPU.

Changing how anything is timed changes MEASUREMENT_VERSION, which starts new asv series on purpose.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fp8bench.core.bound import BoundEvidence, label_blocks
from fp8bench.core.records import MEASUREMENT_VERSION  # noqa: F401  (re-exported: the timer owns the version)

L2_FLUSH_BYTES = 256 * 1024 * 1024  # > the 50-60 MB L2 of H100/H200/B200


@dataclass(frozen=True)
class Timing:
    samples_ms: list[float]
    flushed_l2: bool
    cuda_graph: bool
    last_result: object = None
    """What the last timed call returned (saves one more call for the numerics checks)."""
    injected_slowdown: float | None = None
    """CUDA, test-only `slowdown`: the fraction the filler added, measured against fn alone before sampling."""
    rounds: list[list[float]] | None = None
    """Interleaved timing (time_interleaved): the samples of each round, in round order; None otherwise."""
    gpu_busy_pct: float | None = None
    """CUDA, interleaved: the median over the timed blocks of device time over wall time (`bound`). Well under
    100% means the GPU waited for the host to launch work. None on a CPU or where no block was measured."""
    bound: BoundEvidence | None = None
    """CUDA, interleaved: every timed block's wall and device time and the label the rule gives them
    (fp8bench.core.bound); None on a CPU, where there is no label."""
    process_of_round: list[int] | None = None
    """Interleaved timing repeated in several processes (measure.processes): the process each of `rounds` was
    timed in (rounds are listed process by process); None for one process."""

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def iqr_ms(self) -> float:
        if len(self.samples_ms) < 2:
            return 0.0
        q = statistics.quantiles(self.samples_ms, n=4, method="inclusive")
        return q[2] - q[0]


class L2Flusher:
    """Empties the GPU's L2 when called, as the timers do before each timed call: zeroes `L2_FLUSH_BYTES`."""

    def __init__(self) -> None:
        self.buf = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")

    def __call__(self) -> None:
        self.buf.zero_()


def time_fn(fn: Callable[[], object], *, device: torch.device, warmup: int, iters: int, min_samples: int,
            max_time_s: float, flush_l2: bool = False, cuda_graph: bool = False, settle_ms: float = 0.0,
            slowdown: float = 0.0) -> Timing:
    """Time `fn` per iteration: `warmup` untimed calls, then (CUDA) `settle_ms` of untimed back-to-back calls,
    then samples until `iters` or `max_time_s`.

    `slowdown` (test-only) stretches every timed iteration by that fraction, inside the timed region."""
    if device.type == "cuda":
        return _time_cuda(fn, warmup, iters, min_samples, max_time_s, flush_l2, cuda_graph, settle_ms, slowdown)
    return _time_cpu(_slowed_cpu(fn, slowdown) if slowdown else fn, warmup, iters, min_samples, max_time_s)


def _slowed_cpu(fn: Callable[[], object], fraction: float) -> Callable[[], object]:
    """fn followed by a busy wait of `fraction` x fn's own duration."""
    def slowed():
        t0 = time.perf_counter_ns()
        out = fn()
        until = time.perf_counter_ns() + (time.perf_counter_ns() - t0) * fraction
        while time.perf_counter_ns() < until:
            pass
        return out
    return slowed


def event_samples(fn: Callable[[], object], n: int) -> list[float]:
    """n back-to-back CUDA-event timings of fn (ms), read after one sync: no idle gap between them."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]


def _event_ms(fn: Callable[[], object], n: int) -> float:
    return statistics.median(event_samples(fn, n))


FEEDBACK_ROUNDS = 8
"""At most this many feedback rounds (each under a second on a millisecond GEMM): fewer leave some slowed runs
more than a tenth off the set fraction on a power-capped GPU (docs/regression.md)."""


def _slowed_cuda(fn: Callable[[], object], fraction: float,
                 device: torch.device) -> tuple[Callable[[], object], float]:
    """(fn followed by tensor-core work, the fraction that work added as measured) with the work sized so
    that it adds `fraction` in the state the GPU is in now (call it with the clocks settled).

    Busy work rather than an idle wait: under a power limit an idle GPU's clocks rise and the work around
    the wait speeds up. But busy work has its own power draw, so no length computed from the filler's speed
    alone adds the intended fraction to every workload (it adds less to a GEMM and more to a block of many
    small kernels). The length is therefore corrected by feedback: blocks of fn alone and fn + filler
    alternate (two blocks of a few hundred milliseconds per round) until their medians differ by the
    fraction within a tenth of it, FEEDBACK_ROUNDS rounds at most. Only each block's second half is timed:
    timed from its first sample, a block measures the clocks' transition between the two loads, and the
    length it sets misses the fraction widely on a power-capped GPU (docs/regression.md)."""
    from fp8bench_kernels.tensor_core_load import make_operand, tensor_core_load

    a = make_operand(device)
    programs = torch.cuda.get_device_properties(device).multi_processor_count
    buf = torch.empty(programs, a.shape[0], a.shape[0], device=device)
    fn_ms = _event_ms(fn, 5)
    # duration = launch + slope x iters, from two lengths: the first guess
    short, long = (_event_ms(lambda n=n: tensor_core_load(a, n, programs, buf), 5) for n in (64, 1024))
    slope = (long - short) / 960
    iters = max(1, round((fraction * fn_ms - (short - 64 * slope)) / slope))

    def slowed():
        out = fn()
        tensor_core_load(a, iters, programs, buf)
        return out

    block = max(5, math.ceil(100.0 / fn_ms))
    best_iters, best_added = iters, math.inf
    for _ in range(FEEDBACK_ROUNDS):
        base, slow = [], []
        for _ in range(2):  # each block's first half settles the clocks to that load; its second half counts
            base += event_samples(fn, 2 * block)[block:]
            slow += event_samples(slowed, 2 * block)[block:]
        b, s = statistics.median(base), statistics.median(slow)
        added = s / b - 1.0
        if abs(added - fraction) < abs(best_added - fraction):
            best_iters, best_added = iters, added
        if abs(added - fraction) <= 0.1 * fraction:
            break
        # scale the filler by what it should add over what it added, at most 2x either way: a noisy
        # round must not send the length far off (an unbounded step can overshoot the fraction many times)
        factor = fraction * b / (s - b) if s > b else 2.0
        iters = max(1, round(iters * min(2.0, max(0.5, factor))))
    # without a round within a tenth, the length that came closest, not the last (untried) correction. The
    # fraction returned is that round's own reading, so it leans toward the set one: tests judge what the
    # knob added by their own runs with and without it (tests/test_gpu.py)
    iters = best_iters
    return slowed, best_added


def _time_cpu(fn: Callable[[], object], warmup: int, iters: int, min_samples: int, max_time_s: float) -> Timing:
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    result = None
    deadline = time.perf_counter() + max_time_s
    while len(samples) < iters and (len(samples) < min_samples or time.perf_counter() < deadline):
        t0 = time.perf_counter_ns()
        result = fn()
        samples.append((time.perf_counter_ns() - t0) / 1e6)
    return Timing(samples, False, False, result)


def _time_cuda(fn: Callable[[], object], warmup: int, iters: int, min_samples: int, max_time_s: float,
               flush_l2: bool, cuda_graph: bool, settle_ms: float, slowdown: float) -> Timing:
    """Events around each iteration, queued back to back and read after one final sync (as
    triton.testing.do_bench does): a sync per iteration would let the GPU idle and re-boost its clocks
    between kernels, timing burst rather than sustained speed (docs/regression.md: how far apart).

    Settling: a power-limited GPU steps its clocks down over the first tens of milliseconds of load (a large
    GEMM's iterations lengthen step by step within its first few dozen), so samples taken straight after warm-up
    straddle the steps and their median moves between runs. `settle_ms` of untimed iterations, queued with
    no sync before the samples, lets the clocks reach the level they hold under sustained load first."""
    run = fn
    if cuda_graph:
        fn()  # allocate outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    flush = L2Flusher() if flush_l2 else None

    def one() -> object:
        if flush:
            flush()
        return run()

    for _ in range(warmup):
        run()
    n = iters
    per_iter_ms = None
    if iters > min_samples or settle_ms:  # estimate one iteration to size the sample count and the settling
        torch.cuda.synchronize()
        est_start, est_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        est_start.record()
        for _ in range(3):
            one()
        est_end.record()
        est_end.synchronize()
        per_iter_ms = max(est_start.elapsed_time(est_end) / 3, 1e-3)
        n = int(min(iters, max(min_samples, max_time_s * 1e3 / per_iter_ms)))
    if settle_ms and per_iter_ms:
        for _ in range(math.ceil(settle_ms / per_iter_ms)):
            one()
    injected = None
    if slowdown:  # sized in the settled state; its syncs are short, a quarter of the settling follows
        run, injected = _slowed_cuda(run, slowdown, torch.device("cuda", torch.cuda.current_device()))
        for _ in range(math.ceil(settle_ms / 4 / per_iter_ms) if settle_ms and per_iter_ms else 0):
            one()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    result = None
    for i in range(n):
        if flush:
            flush()
        starts[i].record()
        result = run()
        ends[i].record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
    return Timing(samples, flush is not None, cuda_graph, None if cuda_graph else result, injected)


MAX_BLOCK = 64
"""Iterations of one op per round at most (a microsecond-scale op fills `block_ms` with this many)."""
REPLAY_MAX = 16
"""Iterations of a block replayed behind a sleep at most (its device time per iteration stands for the block's).
Each iteration takes four to six entries of CUDA's launch queue, and the block launched normally may still be
queued ahead of the replay; past ~1000 pending entries the host blocks, and no sleep can then give it a head
start (DEVICE_ONLY_BATCH)."""
HEAD_START = (2.0, 0.3)
"""A replay's sleep lasts HEAD_START[0] x the host's time to enqueue it (from the block just launched) plus
HEAD_START[1] ms: room for the host to be slower than in the block it was sized from."""


def time_interleaved(ops: dict[str, Callable[[], object]], *, device: torch.device, warmup: int, rounds: int,
                     block_ms: float, settle_ms: float = 0.0, flush_l2: bool = False, cuda_graph: bool = False,
                     slowdown: float = 0.0) -> dict[str, Timing]:
    """Time several ops side by side: `rounds` rounds, each running every op for a block of back-to-back
    iterations (enough to last `block_ms`, at least one), the order rotated by one op per round so no op
    always follows the same neighbour. Drift of the clocks over the rounds reaches every op alike, so the
    ratio of two ops' times within a round cancels it (fp8bench.core.speedup).

    CUDA: one event pair per iteration, queued without a sync across all rounds and read at the end; untimed
    rounds for `settle_ms` first (sustained clocks, as time_fn). After each timed round, every op's block is
    replayed behind a GPU sleep (_replay_round): its device time, beside the block's wall time, is the
    evidence of the bound label (fp8bench.core.bound). `slowdown` (test-only) stretches every op's
    iterations by that fraction, as in time_fn."""
    if not ops:
        return {}
    if device.type != "cuda":
        return _interleaved_cpu(ops, warmup, rounds, block_ms, slowdown)
    runs = {name: _graphed(fn) if cuda_graph else fn for name, fn in ops.items()}
    for fn in runs.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    flush = L2Flusher() if flush_l2 else None
    est = {name: _estimate_ms(fn, flush) for name, fn in runs.items()}
    block = {name: max(1, min(MAX_BLOCK, math.ceil(block_ms / est[name]))) for name in runs}
    round_ms = sum(block[n] * est[n] for n in runs)
    _sleep_cycles_per_ms()  # its first calibration syncs: before the timed region, never inside it
    for _ in range(math.ceil(settle_ms / round_ms) if settle_ms else 0):
        _round(runs, block, flush, 0, timed=False)
    injected: dict[str, float] = {}
    if slowdown:
        here = torch.device("cuda", torch.cuda.current_device())
        for name in list(runs):
            runs[name], injected[name] = _slowed_cuda(runs[name], slowdown, here)
    timed, replays, host_ms, last = [], [], {n: [] for n in runs}, {}
    for r in range(rounds):
        timed.append(_round(runs, block, flush, r, timed=True, host_ms=host_ms, last=last))
        replays.append(_replay_round(runs, block, flush, r, host_ms))
    torch.cuda.synchronize()
    per_round = {n: [[s.elapsed_time(e) for s, e in rnd[n]] for rnd in timed] for n in runs}
    out = {}
    for name in runs:
        evidence = _evidence(per_round[name], [rep[name] for rep in replays])
        out[name] = Timing([x for rnd in per_round[name] for x in rnd], flush is not None, cuda_graph,
                           None if cuda_graph else last.get(name), injected.get(name), per_round[name],
                           evidence.busy_pct, evidence)
    return out


def _replay_round(runs: dict, block: dict, flush: L2Flusher | None, r: int, host_ms: dict) -> dict[str, tuple]:
    """Every op's block of round r replayed (at most REPLAY_MAX iterations), in the round's op order, each
    queued behind a GPU sleep sized from the host's time to enqueue that op's block just now: the host
    enqueues the whole replay while the GPU sleeps, so no kernel of it waits for its launch. No sync: the
    sleeps and replays are read with the rounds. {op: (sleep start, sleep end, cycles, event pairs, host
    enqueue ms)}."""
    names = list(runs)
    k = r % len(names)
    out = {}
    for name in names[k:] + names[:k]:
        n = min(block[name], REPLAY_MAX)
        cycles = int((HEAD_START[0] * n * host_ms[name][-1] + HEAD_START[1]) * _sleep_cycles_per_ms())
        s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s0.record()
        torch.cuda._sleep(cycles)
        s1.record()
        t0 = time.perf_counter()
        pairs = _enqueue(runs[name], flush, n)
        out[name] = (s0, s1, cycles, pairs, (time.perf_counter() - t0) * 1e3)
    return out


def _evidence(wall_rounds: list[list[float]], replays: list[tuple]) -> BoundEvidence:
    """The bound label of one op from its timed blocks (mean wall time per iteration) and their replays (mean
    device time per iteration; NaN where the host took longer to enqueue the replay than the sleep lasted,
    so some kernel may have waited for its launch). Read after the rounds' sync."""
    wall, device, rates = [], [], []
    for samples, (s0, s1, cycles, pairs, enqueue_ms) in zip(wall_rounds, replays, strict=True):
        slept = s0.elapsed_time(s1)
        wall.append(statistics.fmean(samples))
        ahead = enqueue_ms < slept  # the host started enqueuing before the sleep began, and finished first
        device.append(statistics.fmean(s.elapsed_time(e) for s, e in pairs) if ahead else math.nan)
        rates.append(cycles / max(slept, 1e-3))
    # the sleep counts clock cycles and the clock moves with the load: size the next group's sleeps from
    # the milliseconds these lasted
    _SLEEP_CYCLES_PER_MS[0] = statistics.median(rates)
    return label_blocks(wall, device)


def _graphed(fn: Callable[[], object]) -> Callable[[], object]:
    fn()  # allocate outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _estimate_ms(fn: Callable[[], object], flush: L2Flusher | None) -> float:
    """One iteration's time, from three (after one sync): sizes the blocks of a round."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        if flush:
            flush()
        fn()
    end.record()
    end.synchronize()
    return max(start.elapsed_time(end) / 3, 1e-3)


def _round(runs: dict, block: dict, flush, r: int, *, timed: bool, host_ms: dict | None = None,
           last: dict | None = None) -> dict:
    """One round: each op's block, the op order rotated by r. Timed: {op: [(start, end) events]}; the host's
    enqueue time per iteration goes to host_ms[op] (sizes the replay's head start, _replay_round)."""
    names = list(runs)
    k = r % len(names)
    events: dict = {}
    for name in names[k:] + names[:k]:
        if not timed:
            for _ in range(block[name]):
                if flush:
                    flush()
                runs[name]()
            continue
        t0 = time.perf_counter()
        events[name] = _enqueue(runs[name], flush, block[name], last, name)
        host_ms[name].append((time.perf_counter() - t0) * 1e3 / block[name])
    return events


_SLEEP_CYCLES_PER_MS: list[float] = []


def _sleep_cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of torch.cuda._sleep: a first measurement (it syncs), then the rate of
    the latest sleeps (_evidence, _queued_behind_sleep): the clock moves with the load, and a sleep sized at
    an idle GPU's clock runs several times shorter than meant once the clocks have risen."""
    if not _SLEEP_CYCLES_PER_MS:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(2_000_000)
        end.record()
        end.synchronize()
        _SLEEP_CYCLES_PER_MS.append(2_000_000 / max(start.elapsed_time(end), 1e-3))
    return _SLEEP_CYCLES_PER_MS[0]


def _queued_behind_sleep(fn: Callable[[], object], flush: L2Flusher | None, n: int, host_ms: float) -> list | None:
    """n iterations of fn as `_enqueue` queues them, behind a GPU sleep, read after a sync: the (start, end)
    event pairs when the host enqueued them all before the sleep ended, so that no kernel waited for its launch.
    The sleep is first sized from `host_ms`, the host's time to enqueue one iteration: 1.5 times the batch's,
    plus 0.2 ms. It is lengthened and the batch run again when the host fell behind; None after three tries."""
    cycles = (1.5 * n * host_ms + 0.2) * _sleep_cycles_per_ms()
    for _ in range(3):
        torch.cuda.synchronize()
        s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s0.record()
        torch.cuda._sleep(int(cycles))
        s1.record()
        t0 = time.perf_counter()
        pairs = _enqueue(fn, flush, n)
        enqueue_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        slept_ms = s0.elapsed_time(s1)
        _SLEEP_CYCLES_PER_MS[0] = cycles / max(slept_ms, 1e-3)  # the clock now, for the next op's first try
        if enqueue_ms < slept_ms:
            return pairs
        # The sleep counts clock cycles, and the clock it runs at moves with the load: size the next one from
        # the milliseconds this one actually lasted, not from the calibration.
        cycles = min(cycles * (2.0 * enqueue_ms + 1.0) / max(slept_ms, 1e-3), 1000.0 * _sleep_cycles_per_ms())
    return None


DEVICE_ONLY_BATCH = 50
"""Iterations queued behind one sleep by `time_device_only`: each takes four to six entries of CUDA's launch
queue (the flush, two events, the call's kernels), and the host blocks once about a thousand are pending (a
few hundred iterations of a one-kernel loop; fp8bench.report.kernel_tables.HOST_PACED), which no sleep can
hide."""


def time_device_only(fn: Callable[[], object], *, device: torch.device, warmup: int = 10, batches: int = 6,
                     batch: int = DEVICE_ONLY_BATCH, flush_l2: bool = False) -> Timing | None:
    """Per-iteration GPU time of `fn` with the host's cost taken out: `batches` batches of `batch` (at most
    DEVICE_ONLY_BATCH) iterations, each timed as time_fn times one (the L2 flushed before it when asked, events around it) and
    each batch queued behind a GPU sleep long enough for the host to enqueue all of it. What a program whose
    host runs ahead of its GPU (a large model's training step) pays for the call: its kernels and the gaps
    between them, but not the Python, allocations and launch calls that time_fn's span holds wherever the
    host is slower than the GPU. None when the host could not get ahead (`fn` synchronizes, or enqueues
    more than CUDA's launch queue holds)."""
    if device.type != "cuda":
        raise ValueError(f"time_device_only times a GPU's work; got device {device}")
    batch = max(1, min(batch, DEVICE_ONLY_BATCH))
    flush = L2Flusher() if flush_l2 else None
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()  # the host's enqueue time per iteration sizes the sleeps
    _enqueue(fn, flush, batch)
    host_ms = (time.perf_counter() - t0) * 1e3 / batch
    torch.cuda.synchronize()
    samples: list[float] = []
    for _ in range(batches):
        pairs = _queued_behind_sleep(fn, flush, batch, host_ms)
        if pairs is None:
            return None
        samples += [s.elapsed_time(e) for s, e in pairs]
    return Timing(samples, flush is not None, False)


def _enqueue(fn: Callable[[], object], flush: L2Flusher | None, n: int, last: dict | None = None,
             name: str = "") -> list:
    """n iterations of fn, each between two recorded events (the L2 flushed before each, outside them), queued
    without a sync; the last result goes to last[name] when given. Returns the (start, end) event pairs."""
    pairs = []
    for _ in range(n):
        if flush:
            flush()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        out = fn()
        e.record()
        pairs.append((s, e))
    if last is not None:
        last[name] = out
    return pairs


def _interleaved_cpu(ops: dict[str, Callable[[], object]], warmup: int, rounds: int, block_ms: float,
                     slowdown: float) -> dict[str, Timing]:
    runs = {n: _slowed_cpu(fn, slowdown) if slowdown else fn for n, fn in ops.items()}
    for fn in runs.values():
        for _ in range(warmup):
            fn()
    est = {}
    for name, fn in runs.items():
        t0 = time.perf_counter_ns()
        fn()
        est[name] = max((time.perf_counter_ns() - t0) / 1e6, 1e-3)
    block = {name: max(1, min(MAX_BLOCK, math.ceil(block_ms / est[name]))) for name in runs}
    names = list(runs)
    per_round: dict[str, list[list[float]]] = {n: [] for n in names}
    last = {}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples = []
            for _ in range(block[name]):
                t0 = time.perf_counter_ns()
                last[name] = runs[name]()
                samples.append((time.perf_counter_ns() - t0) / 1e6)
            per_round[name].append(samples)
    return {n: Timing([x for rnd in per_round[n] for x in rnd], False, False, last.get(n), None, per_round[n])
            for n in names}


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def steady_peak_bytes(step: Callable[[], object], device: torch.device, others_bytes: int = 0) -> int | None:
    """Peak bytes of one `step()` run on its own (None on CPU), less `others_bytes` held by other cases alive
    beside it. Measured apart from timing: the timer's L2-flush buffer (256 MiB, live through every timed
    iteration) must not count as the workload's memory."""
    reset_peak_memory(device)
    step()
    peak = peak_memory_bytes(device)
    return None if peak is None else peak - others_bytes


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak bytes allocated by torch since the last reset; None on CPU (torch keeps no such counter there)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    return None
