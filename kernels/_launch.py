"""Launching a Triton kernel without Triton's per-call dispatch, once it has been compiled and tuned.

`kernel[grid](...)` binds and specializes every argument, builds a cache key from them, looks the binary up,
checks the kernel's globals and, for an autotuned kernel, looks its config up too: tens of microseconds of
host time a call, as long as the kernels themselves take at a training step's shapes (`scripts/recipe_bench.py
--only host` measures it; docs/kernels.md gives the figures). The first
call with a new `launch_key` goes through Triton as before (compiling and tuning); `Launcher` keeps the
compiled kernel it returns and the config the autotuner chose, and later calls with the same key launch that
binary directly (`CompiledKernel[grid](*args)`), running the config's pre-hook as the autotuner would.

The key holds everything Triton specializes a binary on, and more: each tensor's dtype and whether its address
is 16-byte aligned, each integer's exact value (Triton specializes 1 and multiples of 16), a tensor
descriptor's dtype, alignment, shape, strides, block shape and layout, and every other argument as it is.
Under Triton's interpreter nothing is compiled and every call goes through Triton.

What a direct launch does not redo: Triton's check that the kernel's globals have not changed (ours read only
constexpr globals, which tests/kernels/test_constexpr_globals.py checks), its pre-run hooks (none are set),
and the options it reads from `triton.knobs` on each call (debug, instrumentation): set those before a kernel's
first call."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from triton.compiler.compiler import CompiledKernel
from triton.runtime.autotuner import Autotuner


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) on the host: `triton.cdiv` is a constexpr function whose every call goes through Triton's
    dispatch, and a cast's launcher computes several."""
    return -(-a // b)


def _spec(arg: Any) -> Any:
    kind = type(arg)
    if kind is int:  # most arguments; a bool is typed apart below (True == 1, but Triton types them apart)
        return arg
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    base = getattr(arg, "base", None)
    if hasattr(base, "data_ptr") and hasattr(arg, "block_shape"):  # a host-side tensor descriptor (its base a
        # tensor, or anything with the dtype and data_ptr() that Triton reads of it)
        return (base.dtype, base.data_ptr() % 16 == 0, tuple(arg.shape), tuple(arg.strides),
                tuple(arg.block_shape), getattr(arg, "layout", None))
    return kind, arg


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device`, a persistent grid's size (4 off CUDA: under Triton's interpreter a
    few programs exercise the grid-stride loops)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def _has_cuda() -> bool:
    return torch.cuda.is_available()


def current_device() -> int:
    """The device Triton compiles and launches for (-1 without CUDA: the interpreter). Whether CUDA exists is
    asked once: `torch.cuda.is_available()` reads the environment on each call, a few microseconds of every
    launch."""
    return torch.cuda.current_device() if _has_cuda() else -1


def launch_key(args: tuple, kwargs: dict) -> tuple:
    """What selects a compiled binary, for `args` and the constexpr `kwargs` of one call (keywords in the
    order given: another order only misses the cache)."""
    return (current_device(), *map(_spec, args), *[(name, _spec(value)) for name, value in kwargs.items()])


def cast_key(x: torch.Tensor, ints: tuple, *flags: bool) -> tuple:
    """`Launcher.launch`'s key for a cast kernel: the device, X's dtype and alignment, the integer arguments
    (`ints`: every one after the tensors) and the constexpr flags. The outputs (and a cast's scratch) are the
    cast's own fresh allocations (the caching allocator's blocks, 512-byte aligned) in the dtype each launcher
    always gets, so they add nothing; building this instead of `launch_key` over every argument saves a few µs a
    call."""
    return (current_device(), x.dtype, x.data_ptr() % 16 == 0, *ints, *flags)


class Launcher:
    """`Launcher(kernel)(grid, *args, **kwargs)` does what `kernel[grid](*args, **kwargs)` does, faster after
    the first call with a key (module docstring). `fast_launches` counts the calls that bypassed Triton."""

    direct = True
    """False: every call goes through Triton (scripts/recipe_bench.py times the host's cost both ways)."""
    host_launches = 0
    """Calls of every Launcher in this process, either path: a step replayed from a CUDA graph adds none."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.tuned = isinstance(kernel, Autotuner)
        python_fn = (kernel.fn if self.tuned else kernel).fn
        self.name = python_fn.__name__
        signature = self.signature = inspect.signature(python_fn).parameters
        self.arg_names: list[str] = list(signature)
        # a parameter with a default may be left out by both the call and the config: Triton binds the default
        self.defaults = {name: p.default for name, p in signature.items() if p.default is not inspect.Parameter.empty}
        self._compiled: dict[tuple, tuple[CompiledKernel, dict, Any, int, tuple]] = {}
        self.fast_launches = 0

    def _constexprs(self) -> set[str]:
        """The kernel's constexpr parameters, by name: those annotated `tl.constexpr` or `gl.constexpr` (a string
        under `from __future__ import annotations`), as Triton reads them."""
        return {name for name, p in self.signature.items() if "constexpr" in str(p.annotation)}

    def arguments(self, args: tuple, kwargs: dict, tuned_kwargs: dict) -> dict:
        """Every parameter's value, by name, as Triton binds them: defaults, then the call's positional and
        keyword arguments, then the tuned config's."""
        named = dict(self.defaults)
        named.update(zip(self.arg_names, args, strict=False))  # the rest come as keywords
        named.update(kwargs)
        named.update(tuned_kwargs)
        return named

    def __call__(self, grid, *args, **kwargs) -> None:
        if not Launcher.direct:
            Launcher.host_launches += 1  # Triton's own call and nothing else (the A/B's other arm)
            self.kernel[grid](*args, **kwargs)
            return
        self.launch(launch_key(args, kwargs), grid, args, kwargs)

    def launch(self, key: tuple, grid, args: tuple, kwargs: dict) -> None:
        """The call with a key of the caller's own, cheaper to build than `launch_key` where the caller knows
        what varies: it must tell apart any two calls that Triton could compile to different binaries (the
        device, dtypes, alignments, integers and descriptors' blocks and layouts of `launch_key`). Where every
        parameter the call does not pass positionally (its keywords, the tuned config's, defaults) is a
        constexpr, which the key then fixes, a tuple grid's calls after the first bind them once per key. A
        launcher called this way should be called this way only, so that its keys come from one rule."""
        Launcher.host_launches += 1
        if not Launcher.direct:
            self.kernel[grid](*args, **kwargs)
            return
        hit = self._compiled.get(key)
        if hit is None:
            compiled = self.kernel[grid](*args, **kwargs)
            config = self.kernel.best_config if self.tuned else None
            tuned_kwargs = dict(config.kwargs) if config else {}
            # checked on each key's first call, under the interpreter too: a later direct launch binds the
            # same way, so CI sees a parameter it would miss
            named = self.arguments(args, kwargs, tuned_kwargs)
            missing = set(self.arg_names) - set(named)
            if missing:
                raise TypeError(f"{self.name}: no value for {sorted(missing)} to launch directly with")
            if isinstance(compiled, CompiledKernel):  # None under the interpreter
                # where every parameter after the call's positional ones is a constexpr (the tuned config's,
                # the call's keywords, defaults), the key fixes them: bound once, here, for the fast path; a
                # runtime parameter passed by keyword keeps the key on the path that binds each call's own
                rest = self.arg_names[len(args):]
                positional = len(args) if set(rest) <= self._constexprs() else -1
                tail = tuple(named[name] for name in rest)
                self._compiled[key] = (compiled, tuned_kwargs, config.pre_hook if config else None, positional, tail)
            return
        compiled, tuned_kwargs, pre_hook, positional, tail = hit
        if pre_hook is None and not callable(grid) and len(args) == positional:
            # the common case, without building the arguments by name: a few µs less of host time a call
            compiled[(*grid, 1, 1)[:3]](*args, *tail)
        else:
            named = self.arguments(args, kwargs, tuned_kwargs)
            if pre_hook is not None:
                pre_hook(named)
            shape = grid(named) if callable(grid) else grid
            compiled[(*shape, 1, 1)[:3]](*(named[name] for name in self.arg_names))
        self.fast_launches += 1
