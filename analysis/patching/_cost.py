"""What a batched pass costs: its memory derived from the model's sizes, its time measured.

The planner weighs fewer, larger passes (less fixed cost per forward call: Python, hook
dispatch, kernel launches) against the rows they waste. Neither side is a constant: the
fixed cost and the time per multiply-add are measured once per device, dtype and width,
at a few sizes (a CPU gets slower per row once a pass outgrows its caches; an
accelerator faster).
"""

import dataclasses
import os
import time

import torch

from hookedattn import HookedTransformer


def itemsize(model: HookedTransformer) -> int:
    """Bytes of one number in the model's dtype."""
    return torch.empty((), dtype=model.cfg.dtype).element_size()


def row_floats(model: HookedTransformer, n_keys: int) -> int:
    """Numbers one position holds at the peak of a block attending to `n_keys` keys
    (residual stream, q/k/v/z, scores and pattern, MLP hidden layer), with some slack."""
    cfg = model.cfg
    return (
        8 * cfg.d_model
        + 6 * cfg.n_heads * cfg.d_head
        + 3 * cfg.n_heads * n_keys
        + 3 * (cfg.d_mlp or 0)
    )


def block_flops(model: HookedTransformer, n_keys: int) -> int:
    """Multiply-adds of one position through one block attending to `n_keys` keys."""
    cfg = model.cfg
    heads = cfg.n_heads * cfg.d_head
    return 4 * cfg.d_model * heads + 2 * heads * n_keys + 2 * cfg.d_model * (cfg.d_mlp or 0)


def unembed_flops(model: HookedTransformer) -> int:
    """Multiply-adds of one position through the unembedding."""
    return model.cfg.d_model * model.cfg.d_vocab_out


def default_memory_budget(model: HookedTransformer) -> int:
    """Bytes a pass may hold unless the caller says: a quarter of what the device has free."""
    device = torch.device(model.cfg.device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 4
    pages = _sysconf("SC_AVPHYS_PAGES") or _sysconf("SC_PHYS_PAGES")
    return (pages * (_sysconf("SC_PAGE_SIZE") or 4096)) // 4 if pages else 2**31


def _sysconf(name: str) -> int:
    try:
        return max(0, os.sysconf(name))
    except (ValueError, OSError, AttributeError):
        return 0


@dataclasses.dataclass(frozen=True)
class PassCost:
    """Measured: `call_s` seconds per forward call of a block, and `flop_s[i]` seconds per
    multiply-add in a pass of `rows[i]` rows (the planner reads the nearest size)."""

    call_s: float
    rows: tuple[int, ...]
    flop_s: tuple[float, ...]

    def seconds(self, calls: int, rows: int, flops: int) -> float:
        """Estimated time of `calls` forward calls that run `rows` rows, `flops` in all."""
        i = min(range(len(self.rows)), key=lambda j: abs(self.rows[j] - rows))
        return calls * self.call_s + flops * self.flop_s[i]


_MEASURED: dict[tuple, PassCost] = {}


def pass_cost(model: HookedTransformer) -> PassCost:
    """The measured `PassCost` for `model`'s device, dtype and widths (memoised).

    Measured apart from `model`, whose hooks must see only the sweep's own passes: the
    fixed cost on a one-layer stand-in of our blocks, the time per multiply-add on a
    product as wide as `model`'s attention, at row counts from 64 up to ~10 ms of work.
    """
    cfg = model.cfg
    key = (str(cfg.device), cfg.dtype, cfg.d_model, cfg.n_heads * cfg.d_head)
    key += (torch.get_num_threads(),)
    if key not in _MEASURED:
        _MEASURED[key] = PassCost(_call_seconds(cfg.device, cfg.dtype), *_flop_seconds(model))
    return _MEASURED[key]


def _call_seconds(device: str | torch.device, dtype: torch.dtype) -> float:
    # Imported here: the stand-in is built once per device and dtype.
    from hookedattn import HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=1, d_model=8, n_heads=1, d_head=8, n_ctx=4, d_vocab=4, attn_only=True,
        device=str(device), dtype=dtype, seed=0,
    )  # fmt: skip
    stand_in = HookedTransformer(cfg)
    resid = torch.zeros(1, 1, 8, dtype=dtype, device=device)
    return _best_seconds(lambda: stand_in(resid, start_at_layer=0, stop_at_layer=1), resid)


def _flop_seconds(model: HookedTransformer) -> tuple[tuple[int, ...], tuple[float, ...]]:
    cfg = model.cfg
    width = 4 * cfg.n_heads * cfg.d_head
    weight = torch.zeros(cfg.d_model, width, dtype=cfg.dtype, device=cfg.device)
    rows, flop_s = [], []
    n_rows = 64
    while True:
        x = torch.zeros(n_rows, cfg.d_model, dtype=cfg.dtype, device=cfg.device)
        seconds = _best_seconds(lambda x=x: x @ weight, x)
        rows.append(n_rows)
        flop_s.append(max(seconds, 1e-12) / (n_rows * cfg.d_model * width))
        if seconds > 0.01 or n_rows >= 2**20:
            return tuple(rows), tuple(flop_s)
        n_rows *= 4


def _best_seconds(fn, like: torch.Tensor) -> float:
    best = float("inf")
    with torch.no_grad():
        for _ in range(3):
            if like.is_cuda:
                torch.cuda.synchronize(like.device)
            start = time.perf_counter()
            fn()
            if like.is_cuda:
                torch.cuda.synchronize(like.device)
            best = min(best, time.perf_counter() - start)
    return best
