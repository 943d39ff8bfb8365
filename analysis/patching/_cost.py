"""What a batched pass costs: its memory derived from the model's sizes, its time measured.

The planner weighs fewer, larger passes (less fixed cost per forward call: Python, hook
dispatch, kernel launches) against the rows they waste. Neither side is a constant: the
fixed cost and the time per row are measured once per configuration and sequence
length, at a few sizes (a CPU gets slower per row once a pass outgrows its caches; an
accelerator faster).
"""

import bisect
import dataclasses
import os
import time
from collections.abc import Callable

import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.kv_cache import KeyValueCache, KeyValueCacheEntry


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
    """Measured: `pass_s` seconds per pass beyond its blocks' work (a whole pass of one
    position through one block: building it, its calls, its logits); `call_s` per further
    block call; `row_s[i]` per position a block runs, in passes of about `rows[i]`
    positions (the nearest size is read); `key_s` per earlier position a sequence holds
    in a block's KV cache."""

    pass_s: float
    call_s: float
    rows: tuple[int, ...]
    row_s: tuple[float, ...]
    key_s: float

    def seconds(self, calls: int, rows: float, keys: int) -> float:
        """Estimated time of `calls` block calls that run `rows` rows holding `keys` keys."""
        i = bisect.bisect_left(self.rows, rows)
        if i == len(self.rows) or (i and rows - self.rows[i - 1] < self.rows[i] - rows):
            i -= 1
        return self.pass_s + (calls - 1) * self.call_s + rows * self.row_s[i] + keys * self.key_s


_MEASURED: dict[tuple, PassCost] = {}


def pass_cost(
    model: HookedTransformer, n_pos: int, time_pass: Callable[[HookedTransformer, int], float]
) -> PassCost:
    """The measured `PassCost` of `model`'s blocks on `n_pos` positions (memoised).

    Measured on a one-block stand-in of the same configuration, so that hooks attached
    to `model` see only the sweep's own passes: `time_pass(stand_in, n_pos)` (the best
    time of a whole pass of one variant, one position); one position through the block;
    ever more sequences of `n_pos` until a call takes about 10 ms; and sequences of one
    position after a KV cache of the `n_pos - 1` before, built as a pass builds it.
    """
    cfg = _one_block(model.cfg)
    key = (repr(cfg), n_pos, torch.get_num_threads())
    if key not in _MEASURED:
        stand_in = HookedTransformer(cfg)
        _MEASURED[key] = _measure(stand_in, n_pos, time_pass(stand_in, n_pos))
    return _MEASURED[key]


def _one_block(cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    """`cfg` with its first block only: every per-layer field (one entry per block, such
    as `attn_types`) cut to its first entry."""
    per_layer = {
        f.name: value[:1]
        for f in dataclasses.fields(cfg)
        if isinstance(value := getattr(cfg, f.name), tuple | list)
        and len(value) == cfg.n_layers
        and f.name != "n_layers"
    }
    return dataclasses.replace(cfg, n_layers=1, **per_layer)


def _measure(stand_in: HookedTransformer, n_pos: int, pass_s: float) -> PassCost:
    call_s = _best_seconds(stand_in, 1, 1, 0)
    rows, row_s = [], []
    n_seq = 1
    while True:
        seconds = _best_seconds(stand_in, n_seq, n_pos, 0)
        rows.append(n_seq * n_pos)
        row_s.append(max(seconds - call_s, 0.0) / (n_seq * n_pos))
        if seconds > 0.01 or n_seq >= 2**12:
            break
        n_seq *= 4
    n_seq, n_past = max(1, rows[-1] // n_pos), n_pos - 1
    with_keys = _best_seconds(stand_in, n_seq, 1, n_past)
    key_s = max(with_keys - _best_seconds(stand_in, n_seq, 1, 0), 0.0) / (n_seq * max(n_past, 1))
    return PassCost(pass_s, call_s, tuple(rows), tuple(row_s), key_s)


def _best_seconds(stand_in: HookedTransformer, n_seq: int, n_pos: int, n_past: int) -> float:
    cfg = stand_in.cfg
    like = dict(dtype=cfg.dtype, device=cfg.device)
    resid = torch.randn(n_seq, n_pos, cfg.d_model, **like)
    n_kv_heads = cfg.n_key_value_heads or cfg.n_heads
    keys = torch.randn(1, n_past, n_kv_heads, cfg.d_head, **like)

    def run() -> None:
        past = None
        if n_past:
            # As a pass builds it: copied per sequence, every sequence masked differently.
            k, v = (keys.repeat(n_seq, 1, 1, 1) for _ in range(2))
            entry = KeyValueCacheEntry(k, v, frozen=True)
            mask = (torch.arange(n_past, device=cfg.device) < n_past - 1).long()
            past = KeyValueCache([entry], mask.repeat(n_seq, 1), frozen=True)
        stand_in(resid, start_at_layer=0, stop_at_layer=1, past_kv_cache=past)

    best = float("inf")
    with torch.no_grad():
        for _ in range(3):
            if resid.is_cuda:
                torch.cuda.synchronize(resid.device)
            start = time.perf_counter()
            run()
            if resid.is_cuda:
                torch.cuda.synchronize(resid.device)
            best = min(best, time.perf_counter() - start)
    return best
