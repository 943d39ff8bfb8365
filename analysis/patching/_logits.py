"""What the metric reads after a pass: each variant's logits, unpatched outside the rows
the pass ran; with declared positions, those positions only (NaN elsewhere), run once
more through the last block where the pass ran a window before them (`Pass.again`).
"""

from collections.abc import Sequence

import torch
from einops import rearrange, repeat
from jaxtyping import Float
from torch import Tensor

from analysis.patching._inputs import Metric, metric_values
from analysis.patching._plan import Pass
from analysis.patching._runs import BaseRun, key_name
from hookedattn import HookedTransformer
from hookedattn.kv_cache import KeyValueCache, KeyValueCacheEntry
from hookedattn.names import get_act_name


def full_logits(
    model: HookedTransformer, base: BaseRun, p: Pass, resid: Float[Tensor, "sequence row d_model"]
) -> list[Float[Tensor, "batch pos d_vocab_out"]]:
    """Every variant's logits: the pass's rows unembedded, the unpatched ones elsewhere
    (one tensor per variant: what the metric reads, assembled where it stays in cache)."""
    n_pos = base.tokens.shape[1]
    with torch.no_grad():
        new = model(resid, start_at_layer=model.cfg.n_layers)
    new = rearrange(new, "(v b) row d -> v b row d", v=len(p.variants))
    out = []
    for v, offset in enumerate(p.offsets):
        end = min(offset + p.rows, n_pos)  # rows past the end are padding
        parts = (base.logits[:, :offset], new[v, :, : end - offset], base.logits[:, end:])
        out.append(torch.cat([x for x in parts if x.shape[1]], dim=1))
    return out


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
    device = resid.device
    positions = torch.tensor(declared, device=device)
    offsets = torch.tensor(p.offsets, device=device)
    row = positions[None] - offsets[:, None]  # [variant declared]
    ran = (row >= 0) & (row < p.rows)
    by_variant = rearrange(resid, "(v b) row d -> v b row d", v=n_variants)
    index = row.clamp(0, p.rows - 1)[:, None, :, None]
    chosen = torch.take_along_dim(by_variant, index, dim=2)
    with torch.no_grad():
        new = model(
            rearrange(chosen, "v b row d -> (v b) row d"), start_at_layer=model.cfg.n_layers
        )
    new = rearrange(new, "(v b) row d -> v b row d", v=n_variants)
    return torch.where(ran[:, None, :, None], new, base.logits[None, :, list(declared)])


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
    offsets = torch.tensor(p.offsets, device=device)
    after = torch.tensor(declared, device=device)[None] >= offsets[:, None] + p.rows
    if not bool(after.any()):
        return logits
    n_keys = max(declared)
    kv = []
    for name, new in zip((key_name(model, last), get_act_name("v", last)), new_kv, strict=True):
        full = repeat(
            base.cache[name][:, :n_keys], "b pos h d -> v b pos h d", v=n_variants
        ).clone()
        new = rearrange(new, "(v b) row h d -> v b row h d", v=n_variants)
        where = offsets[:, None] + torch.arange(p.rows, device=device)
        v_index, row = (where < n_keys).nonzero(as_tuple=True)
        full[v_index, :, where[v_index, row]] = new[v_index, :, row]
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
    return torch.where(after[:, None, :, None], again, logits)


def declared_metric(
    metric: Metric,
    logits: Float[Tensor, "variant batch declared d_vocab_out"],
    declared: Sequence[int],
    n_pos: int,
    labels: Sequence[str],
    unpatched: Float[Tensor, " batch"],
) -> list[Float[Tensor, " batch"]]:
    """`metric` of each variant's logits, NaN outside the declared positions; a
    `ValueError` if that gives NaN where the unpatched metric is not NaN, since then the
    metric read an undeclared position."""
    n_variants, batch, _, d_vocab = logits.shape
    full = logits.new_full((n_variants, batch, n_pos, d_vocab), torch.nan)
    full[:, :, list(declared)] = logits
    values = [metric_values(metric, variant) for variant in full]
    read_nan = torch.stack(values).isnan() & ~unpatched.isnan()
    if bool(read_nan.any()):
        label = labels[int(read_nan.any(dim=1).nonzero()[0])]
        raise ValueError(
            f"the metric gave NaN with {label} patched, on logits that are NaN outside "
            f"metric_positions {list(declared)}: it reads another position (on the "
            f"unpatched runs it did not). Declare every position it reads, or pass "
            f"metric_positions=None"
        )
    return values
