"""What the metric reads after a pass: each variant's logits where they differ from the
unpatched run's; with declared positions, those positions only (NaN elsewhere), run once
more through the last block where the pass ran a window before them (`Pass.again`).

The metric maps one variant's `[batch pos d_vocab_out]` logits to `[batch]`. `Readout`
stacks the full logits of a pass's variants and calls the metric once on the stack
through `torch.func.vmap` (a Python call of a logit difference costs ~20 us, as much as
its whole work: a sweep of 256 small variants spent a sixth of its time there), checked
against a plain call on the first variant of each stack. A metric that vmap cannot run
(a `.item()`, control flow on values, randomness), or that gives other numbers under it,
is called once per variant instead, as it is where a stack would copy much more than the
variants' changed rows (`STACK_BYTES`): on one logits tensor with each variant's rows
written in turn, so that no variant's full logits are copied.
"""

from collections.abc import Callable, Sequence

import torch
from einops import rearrange, repeat
from jaxtyping import Float
from torch import Tensor

from analysis.patching._inputs import (
    BaseRun,
    Metric,
    key_name,
    metric_values,
    nan_except,
    value_name,
)
from analysis.patching._plan import Pass
from hookedattn import HookedTransformer
from hookedattn.core.kv_cache import KeyValueCache, KeyValueCacheEntry
from hookedattn.core.names import get_act_name
from hookedattn.core.tolerances import tolerance

# Where some variants' logits differ from the unpatched run's (the same positions for
# each), and their logits there, `[variant batch position d_vocab_out]`.
Piece = tuple[slice | list[int], Tensor]

# A stack copies each variant's full logits once; one variant at a time writes its changed
# rows in and back (twice). Where a stack copies more than this many bytes a variant
# beyond that, the extra copy costs more than the Python call it saves (on a CPU, ~25 us
# for 256 kB), and the variants are measured one at a time.
STACK_BYTES = 2**18


class Readout:
    """The metric of variants whose logits differ from the unpatched run's at a few
    positions (with `declared` positions, NaN elsewhere): stacked and vmapped, a stack
    within about half of `memory_budget` bytes, or one variant at a time (the module
    docstring)."""

    def __init__(
        self,
        base: BaseRun,
        metric: Metric,
        declared: Sequence[int] | None,
        label: Callable[[int], str] | None,
        memory_budget: int = 2**30,
    ) -> None:
        self.base, self.metric, self.declared, self.label = base, metric, declared, label
        logits = base.logits
        self.unpatched = logits if declared is None else nan_except(logits, declared)
        self.itemsize = self.unpatched.element_size()
        self.stack_size = max(1, memory_budget // (2 * self.unpatched.numel() * self.itemsize))
        # None once a stack has shown that vmap cannot run the metric as it is.
        self.vmapped = torch.func.vmap(metric)
        self.tolerance = tolerance(logits.dtype).as_kwargs()
        self._fresh()

    def values(
        self, variants: Sequence[int], pieces: Sequence[Piece]
    ) -> Float[Tensor, "variant batch"]:
        """The metric of each of `variants`, given the pieces that hold them in order."""
        values = []
        for chunk in _chunks(pieces, self.stack_size):
            stack = self.vmapped is not None and self._extra_bytes(chunk) <= STACK_BYTES
            value = self._stacked_values(chunk) if stack else None
            values.append(self._one_by_one(chunk) if value is None else value)
        out = torch.cat(values)
        if self.declared is not None:
            self._check_declared(variants, out)
        return out

    def _extra_bytes(self, chunk: Sequence[Piece]) -> float:
        """What a stack of `chunk` copies beyond what one variant at a time would, in bytes
        a variant."""
        full = self.unpatched.numel()
        n = sum(len(rows) for _, rows in chunk)
        rows = sum(rows.numel() for _, rows in chunk) / n  # numbers a variant changes
        return (full - 2 * rows) * self.itemsize

    def _stacked_values(self, chunk: Sequence[Piece]) -> Float[Tensor, "variant batch"] | None:
        """The metric of the variants of `chunk` by one vmapped call on their stacked
        logits; None (and no more stacks) where vmap cannot run it or changes its numbers."""
        logits = self._stack(chunk)
        plain = metric_values(self.metric, logits[0].clone())  # a metric may write into it
        try:
            value = self.vmapped(logits)
        except Exception:  # whatever vmap cannot run is run variant by variant
            value = None
        if not (
            isinstance(value, Tensor)
            and value.shape == logits.shape[:2]
            and value.dtype.is_floating_point
            and _agree(value[0], plain, self.tolerance)
        ):
            self.vmapped = None
            return None
        return value

    def _stack(self, chunk: Sequence[Piece]) -> Float[Tensor, "variant batch pos d_vocab_out"]:
        """The full logits of the variants of `chunk`: the unpatched ones, their rows in."""
        (where, rows), n = chunk[0], sum(len(rows) for _, rows in chunk)
        if len(chunk) == 1 and isinstance(where, slice):  # one copy, not two
            before, after = (
                self.unpatched[None, :, part].expand(n, -1, -1, -1)
                for part in (slice(None, where.start), slice(where.stop, None))
            )
            return torch.cat([before, rows, after], dim=2)
        logits = self.unpatched.expand(n, *self.unpatched.shape).clone()
        first = 0
        for where, rows in chunk:
            logits[first : first + len(rows), :, where] = rows
            first += len(rows)
        return logits

    def _one_by_one(self, chunk: Sequence[Piece]) -> Float[Tensor, "variant batch"]:
        """The metric of each variant of `chunk` in turn, its rows written into the one
        scratch logits tensor, then put back unless the next variant overwrites them."""
        flat = [(where, rows) for where, piece in chunk for rows in piece]
        values = []
        keys = [self._key(where) for where, _ in flat]
        for i, (where, rows) in enumerate(flat):
            place, unpatched = self._slot(where)
            write = place.copy_ if place.is_floating_point() else self._put(place)
            write(rows)
            version = self.scratch._version  # counts in-place writes to the tensor
            value = metric_values(self.metric, self.scratch)
            values.append(value if value._base is None else value.clone())  # not a view of it
            if self.scratch._version != version:  # the metric wrote into its input
                self._fresh()
            elif i + 1 == len(flat) or keys[i + 1] != keys[i]:  # else overwritten next
                write(unpatched)
        return torch.stack(values)

    def _fresh(self) -> None:
        self.scratch = self.unpatched.clone()
        # Per place written: the scratch rows there and what to put back (views, made once).
        self._slots: dict[tuple, tuple[Tensor, Tensor]] = {}

    @staticmethod
    def _key(where: slice | list[int]) -> tuple:
        return (where.start, where.stop) if isinstance(where, slice) else tuple(where)

    def _slot(self, where: slice | list[int]) -> tuple[Tensor, Tensor]:
        key = self._key(where)
        if key not in self._slots:
            if isinstance(where, slice):
                self._slots[key] = (self.scratch[:, where], self.unpatched[:, where])
            else:
                index = torch.tensor(where, dtype=torch.long, device=self.scratch.device)
                self._slots[key] = (index, self.unpatched.index_select(1, index))
        return self._slots[key]

    def _put(self, index: Tensor) -> Callable[[Tensor], Tensor]:
        return lambda rows: self.scratch.index_copy_(1, index, rows)

    def _check_declared(self, variants: Sequence[int], values: Tensor) -> None:
        """A `ValueError` where a variant's metric is NaN but the unpatched one is not:
        then the metric read a position outside the declared ones."""
        read_nan = values.isnan() & ~self.base.metric.isnan()
        if not bool(read_nan.any()):
            return
        i = variants[int(read_nan.any(dim=1).nonzero()[0])]
        label = f"variant {i}" if self.label is None else self.label(i)
        raise ValueError(
            f"the metric gave NaN with {label} patched, on logits that are NaN outside "
            f"metric_positions {list(self.declared)}: it reads another position (on the "
            f"unpatched runs it did not). Declare every position it reads, or pass "
            f"metric_positions=None"
        )


def _agree(vmapped: Tensor, plain: Tensor, tol: dict[str, float]) -> bool:
    """Whether a vmapped value is the plain one (to the dtype's tolerance, NaN where NaN)."""
    return bool(torch.equal(vmapped, plain)) or bool(
        torch.isclose(vmapped, plain, equal_nan=True, **tol).all()
    )


def _chunks(pieces: Sequence[Piece], size: int) -> list[list[Piece]]:
    """`pieces` in chunks of at most `size` variants (a piece split where need be)."""
    chunks: list[list[Piece]] = [[]]
    room = size
    for where, rows in pieces:
        while len(rows):
            if room == 0:
                chunks.append([])
                room = size
            chunks[-1].append((where, rows[:room]))
            rows, room = rows[room:], room - min(room, len(rows))
    return chunks


def pass_pieces(
    model: HookedTransformer, p: Pass, resid: Float[Tensor, "sequence row d_model"], n_pos: int
) -> list[Piece]:
    """The variants' logits at the rows the pass ran (not its padding past the end)."""
    with torch.no_grad():
        new = model(resid, start_at_layer=model.cfg.n_layers)
    new = rearrange(new, "(v b) row d -> v b row d", v=len(p.variants))
    rows = slice(p.n_past, min(p.n_past + p.rows, n_pos))
    return [(rows, new[:, :, : rows.stop - rows.start])]


def declared_logits(
    model: HookedTransformer,
    base: BaseRun,
    p: Pass,
    resid: Float[Tensor, "sequence row d_model"],
    declared: Sequence[int],
) -> Float[Tensor, "variant batch declared d_vocab_out"]:
    """Every variant's logits at the declared positions: the pass's rows there, unembedded,
    and the unpatched logits where the pass has no row."""
    n_variants = len(p.variants)
    ran = [i for i, q in enumerate(declared) if 0 <= q - p.n_past < p.rows]
    out = base.logits[None, :, list(declared)].repeat(n_variants, 1, 1, 1)
    if ran:
        rows = [declared[i] - p.n_past for i in ran]
        with torch.no_grad():
            new = model(resid[:, rows], start_at_layer=model.cfg.n_layers)
        out[:, :, ran] = rearrange(new, "(v b) row d -> v b row d", v=n_variants)
    return out


def again(
    model: HookedTransformer,
    base: BaseRun,
    p: Pass,
    new_kv: tuple[Tensor, Tensor],
    declared: Sequence[int],
    logits: Float[Tensor, "variant batch declared d_vocab_out"],
) -> Float[Tensor, "variant batch declared d_vocab_out"]:
    """`logits` with each declared position after a variant's rows run once more through
    the last block, alone, against the unpatched keys and values before it but those of
    the rows the pass ran (`new_kv`, which it changed).

    The positions go side by side along the batch axis, each attending to the keys before
    it (later ones masked), so that each query sees its own causal past and gets its own
    position, which rotary models read."""
    last, n_variants, batch = model.cfg.n_layers - 1, len(p.variants), base.tokens.shape[0]
    device = logits.device
    after = [q >= p.n_past + p.rows for q in declared]
    if not any(after):
        return logits
    n_keys = max(declared)  # the pass's rows lie before it
    kv = []
    for name, new in zip((key_name(model, last), value_name(model, last)), new_kv, strict=True):
        full = repeat(
            base.cache[name][:, :n_keys], "b pos h d -> v b pos h d", v=n_variants
        ).clone()
        new = rearrange(new, "(v b) row h d -> v b row h d", v=n_variants)
        full[:, :, p.n_past : p.n_past + p.rows] = new
        kv.append(repeat(full, "v b pos h d -> (row v b) pos h d", row=len(declared)))
    resid = repeat(
        base.cache[get_act_name("resid_pre", last)][:, list(declared)],
        "b row d -> (row v b) 1 d",
        v=n_variants,
    )
    seen = (
        torch.arange(n_keys, device=device)[None] < torch.tensor(declared, device=device)[:, None]
    )
    mask = repeat(seen.long(), "row pos -> (row v b) pos", v=n_variants, b=batch)
    entry = KeyValueCacheEntry(kv[0], kv[1], frozen=True)
    past = KeyValueCache([entry] * model.cfg.n_layers, mask, frozen=True)
    with torch.no_grad():
        again = model(resid, start_at_layer=last, past_kv_cache=past)
    again = rearrange(again, "(row v b) 1 d -> v b row d", v=n_variants, b=batch)
    after = torch.tensor(after, device=device)[None, None, :, None]
    return torch.where(after, again, logits)
