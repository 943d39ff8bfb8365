"""A record of the large float32 and float64 tensors an operation makes, for the tests that
a low-precision directory loads without a full-precision copy (tests/hf/test_hf_loading.py,
tests/hf/test_hf_moe.py)."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LargeFloat32Tensors(TorchDispatchMode):
    """Records every float32 or float64 tensor of at least `numel` elements an op makes."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.seen = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            wide = isinstance(t, torch.Tensor) and t.dtype in (torch.float32, torch.float64)
            if wide and t.numel() >= self.numel:
                self.seen.append((str(func), tuple(t.shape)))
        return out
