"""Run a reference model in float64 all the way through: `float64_throughout()`.

    hf = hf.double()
    with float64_throughout():
        expected = hf(tokens).logits        # no step rounded to float32 on the way

A float64 copy of a `transformers` model is not float64 all the way: its RMSNorm casts the
stream to float32 (`hidden_states.to(torch.float32)`), its softmaxes ask for
`dtype=torch.float32`, its rotary angles and routers call `.float()`. Those steps round to
float32 whatever the model's dtype, so a stock float64 run is only as exact as float32
(relative errors near 1e-7) and cannot tell an import exact to 1e-12 from one off by 1e-8.

Inside this context every request for float32 becomes a request for float64 (and complex64
for complex128: DeepSeek V2 rotates by complex numbers): the `dtype`
argument of any torch call (factories, `softmax`, `cumsum`, ...), the target of
`Tensor.to` and `Tensor.type`, and `Tensor.float()`; the default dtype is float64 too, so
a tensor made without a dtype is float64. Nothing else changes: the model's own code runs as
written, with its arithmetic in float64. Half-precision requests (bfloat16, float16) are
left as they are: they are part of what a model computes (RecurrentGemma rounds its
embedding scale to bfloat16 on purpose), not a precision floor.

It is a `torch.overrides.TorchFunctionMode`, torch's documented way to intercept calls,
active in the current thread only while the context is open. The verification on load runs
each tiny twin in it (`hf._verify`); `hookedattn.testing` re-exports it for test suites.
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["float64_throughout"]


_LIFTED = {torch.float32: torch.float64, torch.complex64: torch.complex128}


def _lifted(value: Any) -> Any:
    return _LIFTED.get(value, value) if isinstance(value, torch.dtype) else value


class _Float64Throughout(TorchFunctionMode):
    """Every float32 request of a torch call made float64 (see the module docstring)."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if "dtype" in kwargs:
            kwargs["dtype"] = _lifted(kwargs["dtype"])
        if func is torch.Tensor.float:
            func = torch.Tensor.double
        elif func in (torch.Tensor.to, torch.Tensor.type):
            args = (args[0], *(_lifted(arg) for arg in args[1:]))
        return func(*args, **kwargs)


@contextlib.contextmanager
def float64_throughout() -> Iterator[None]:
    """Within the context, torch computes in float64 where code asks for float32 (the
    `dtype` of any call, `Tensor.to(torch.float32)`, `Tensor.float()`) and makes float64
    tensors by default: a float64 model runs with no step rounded to float32."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with _Float64Throughout():
            yield
    finally:
        torch.set_default_dtype(default)
