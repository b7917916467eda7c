"""The current-scaling cast (`quantize_current`): one launch, bit-exact with its reference at any grid, refusing
what it cannot cast, resident on its own streams and in a CUDA graph."""


import pytest
import torch
from kernel_cases import CUDA, DEV, SHAPES, SMALL, bits, data

from fp8bench.core.numerics import fake_quant

# on a GPU also a grid of more programs than 200x300 has tiles (6 or 8), fewer than the H200's 132 SMs: at that
# shape (M, N not multiples of 16) one program of each config takes all of an SM's registers
PROGRAMS = [None, 1, 3, 7, 100] if CUDA else [None]
CURRENT_SHAPES = [*SHAPES, pytest.param(200, 300, marks=pytest.mark.gpu)] if CUDA else SMALL


@pytest.mark.parametrize("config", [0, 1, 2], ids=["default-reversed", "forward", "64x256-reversed"])
@pytest.mark.parametrize("programs", PROGRAMS)
@pytest.mark.parametrize("m,n", CURRENT_SHAPES)
def test_current_scaling_cast_and_transpose_are_bit_exact(k, m, n, programs, config):
    """One launch, any grid: each program folds its tiles' max into the grid's, waits at the barrier for the rest
    and casts its tiles; the largest |x| lies in the last tile. Each launch leaves the barrier's scratch zeroed for
    the next, so calls in a row keep agreeing (the second on data with another amax)."""
    qc = k.quantize_current
    config = qc.CONFIGS[config]
    assert (config["reverse"], config["BLOCK_N"]) == {0: (True, 128), 1: (False, 128), 2: (True, 256)}[
        qc.CONFIGS.index(config)]
    for scale in (1.0, 1e-3):
        x = data(m, n, spread=False) * scale
        x[-1, -1] = 1000.0 * scale
        y, yt, inv = qc.quantize_current(x, programs=programs, config=config)
        ry, ryt, rinv = qc.quantize_current_reference(x)
        assert torch.equal(bits(y), bits(ry)) and torch.equal(bits(yt), bits(ryt)) and torch.equal(inv, rinv)
        emu = fake_quant(x, "e4m3", "current")  # the emulator: the same numbers, from its own code
        assert torch.equal(y.float() * inv, emu)
        assert not qc._scratch[qc.scratch_key(x.device)].any()  # the counters this call used
    y, none, inv = qc.quantize_current(x, transpose=False, programs=programs, config=config)
    assert none is None and torch.equal(bits(y), bits(ry)) and torch.equal(inv, rinv)


def test_current_scaling_cast_refuses_what_it_cannot_cast(k):
    """An empty grid (it would return the outputs unwritten), more elements than its int32 offsets reach (an
    expanded view: no memory behind it) and, under the interpreter, whose programs run one after another, a grid
    the barrier would wait on forever."""
    qc = k.quantize_current
    with pytest.raises(ValueError, match="programs >= 1"):
        qc.quantize_current(data(64, 128), programs=0)
    huge = torch.zeros(1, 1, dtype=torch.bfloat16, device=DEV).expand(2**16, 2**15)
    with pytest.raises(ValueError, match="2\\^31"):
        qc.quantize_current(huge)
    if not CUDA:
        with pytest.raises(ValueError, match="programs=1"):
            qc.quantize_current(data(64, 128), programs=2)
    else:  # more programs than the binary lets the SMs hold: the cooperative launch would fail with a CUDA error
        sms = torch.cuda.get_device_properties(DEV).multi_processor_count
        with pytest.raises(ValueError, match=f"programs={2 * sms} cannot all be resident.*at most {sms} "):
            qc.quantize_current(data(200, 300), programs=2 * sms)  # one program per SM at this specialization
        assert not qc._scratch[qc.scratch_key(torch.device(DEV))].any()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_current_scaling_cast_runs_resident_on_its_own_streams_and_in_a_cuda_graph(k):
    """The default grid is what the SMs hold of the binary at once (the barrier needs every program resident);
    each stream gets its own barrier scratch; a captured launch replays with the data of the moment."""
    qc = k.quantize_current
    x = data(8192, 4096, spread=False)
    qc.quantize_current(x)
    default = qc.CONFIGS[0]
    [programs] = [p for (key, _), p in qc._resident.items() if key[3:5] == (8192, 4096)
                  and key[7:] == (True, default["BLOCK_M"], default["BLOCK_N"], default["num_warps"], True)]
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    assert programs % sms == 0 and sms <= programs <= default["per_sm"] * sms, programs
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # x, written on the default stream
    with torch.cuda.stream(side):
        y, yt, inv = qc.quantize_current(x)
        side_scratch = qc._sync_scratch(x.device)
    torch.cuda.synchronize()
    assert side_scratch.data_ptr() != qc._sync_scratch(x.device).data_ptr()
    ry, ryt, rinv = qc.quantize_current_reference(x)
    assert torch.equal(bits(y), bits(ry)) and torch.equal(bits(yt), bits(ryt)) and torch.equal(inv, rinv)

    static = x.clone()
    qc.quantize_current(static)  # compiled and its grid sized outside the capture (the capture makes its own
    # counters, zeroed in the graph)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, yt, inv = qc.quantize_current(static)
    for seed, scale in ((1, 1.0), (2, 1e-2)):
        static.copy_(data(8192, 4096, seed=seed, spread=False) * scale)
        graph.replay()
        torch.cuda.synchronize()
        ry, ryt, rinv = qc.quantize_current_reference(static)
        assert torch.equal(bits(y), bits(ry)) and torch.equal(bits(yt), bits(ryt)) and torch.equal(inv, rinv)
