"""What compiled Triton rejects and the interpreter accepts, checked on every kernel module: a kernel reads only
constexpr globals."""


import pytest
from kernel_cases import MODULES


@pytest.mark.parametrize("name", MODULES)
def test_kernels_read_only_constexpr_globals(k, name):
    """Compiled Triton rejects a plain module-level number inside @triton.jit (the interpreter accepts it, so
    CI would not otherwise notice): every global a kernel reads must be a function, module or tl.constexpr."""
    import inspect

    import triton
    from triton.runtime.interpreter import InterpretedFunction

    module = getattr(k, name)
    kernels = 0
    for attr, obj in vars(module).items():
        while isinstance(obj, triton.runtime.Autotuner):
            obj = obj.fn
        if not isinstance(obj, (triton.runtime.JITFunction, InterpretedFunction)):
            continue
        kernels += 1
        py = inspect.unwrap(obj.fn)
        for ref in py.__code__.co_names:
            value = py.__globals__.get(ref)
            assert not isinstance(value, (int, float)) or isinstance(value, bool), \
                f"{name}.{attr} reads the plain global {ref}={value!r}; make it tl.constexpr"
    assert kernels > 0, f"found no kernels in {name}"
