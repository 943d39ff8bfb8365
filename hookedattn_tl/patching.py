"""TransformerLens's `patching` module: `(model, corrupted_tokens, clean_cache, metric)`.

Every function patches one clean activation at a time into the corrupted run and records
`patching_metric(logits)`, a scalar over the whole batch, as TL does. When the clean
cache came from `hookedattn_tl.HookedTransformer.run_with_cache` on token ids (it then
knows them), the sweep runs on our batched engine, `analysis.activation_patch`, with its
numbers; otherwise (a cache from elsewhere, or TL's patterns by source position) it runs
TL's loop, one forward per patch, through `generic_activation_patch`.
"""

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor

import analysis
from hookedattn_tl.utils import get_act_name

Metric = Callable[[Tensor], Tensor]
Setter = Callable[[Tensor, Sequence[int], Tensor], Tensor]


# ---------------------------------------------------------------------- TL's patch setters
def layer_pos_patch_setter(corrupted: Tensor, index: Sequence[int], clean: Tensor) -> Tensor:
    """Patch position `pos` of `[batch pos ...]`; `index = (layer, pos)`."""
    _, pos = index
    corrupted[:, pos, ...] = clean[:, pos, ...]
    return corrupted


def layer_pos_head_vector_patch_setter(
    corrupted: Tensor, index: Sequence[int], clean: Tensor
) -> Tensor:
    """Patch one head at one position of `[batch pos head ...]`; `index = (layer, pos, head)`."""
    _, pos, head = index
    corrupted[:, pos, head] = clean[:, pos, head]
    return corrupted


def layer_head_vector_patch_setter(
    corrupted: Tensor, index: Sequence[int], clean: Tensor
) -> Tensor:
    """Patch one head at every position of `[batch pos head ...]`; `index = (layer, head)`."""
    _, head = index
    corrupted[:, :, head] = clean[:, :, head]
    return corrupted


def layer_head_pattern_patch_setter(
    corrupted: Tensor, index: Sequence[int], clean: Tensor
) -> Tensor:
    """Patch one head's whole pattern `[batch head dest src]`; `index = (layer, head)`."""
    _, head = index
    corrupted[:, head] = clean[:, head]
    return corrupted


def layer_head_pos_pattern_patch_setter(
    corrupted: Tensor, index: Sequence[int], clean: Tensor
) -> Tensor:
    """Patch one head's pattern row; `index = (layer, head, dest_pos)`."""
    _, head, dest = index
    corrupted[:, head, dest] = clean[:, head, dest]
    return corrupted


def layer_head_dest_src_pos_pattern_patch_setter(
    corrupted: Tensor, index: Sequence[int], clean: Tensor
) -> Tensor:
    """Patch one pattern entry; `index = (layer, head, dest_pos, src_pos)`."""
    _, head, dest, src = index
    corrupted[:, head, dest, src] = clean[:, head, dest, src]
    return corrupted


# ---------------------------------------------------------------------- the loop
def generic_activation_patch(
    model: Any,
    corrupted_tokens: Any,
    clean_cache: Any,  # loosely annotated: a wrong argument gets _check_order's message
    patching_metric: Metric,
    patch_setter: Setter,
    activation_name: str,
    index_axis_names: Sequence[str] | None = None,
    index_df: Any = None,
    return_index_df: bool = False,
) -> Any:
    """TL's reference loop: one forward per index, `patch_setter` editing the activation.

    `index_axis_names` (e.g. `("layer", "pos", "head")`) spans every index, and the result
    has one axis per name; an `index_df` (a pandas DataFrame of indices) gives a flat
    result with one entry per row.
    """
    _check_order(corrupted_tokens, clean_cache)
    if index_df is None:
        if index_axis_names is None:
            raise ValueError("give index_axis_names (e.g. ('layer', 'pos')) or index_df")
        sizes = _axis_sizes(model, corrupted_tokens, activation_name)
        shape = [sizes[axis] for axis in index_axis_names]
        indices = list(itertools.product(*(range(n) for n in shape)))
    else:
        indices = [tuple(int(i) for i in row) for row in index_df.itertuples(index=False)]
        shape = [len(indices)]
    out = torch.zeros(len(indices))
    for n, index in enumerate(indices):
        name = get_act_name(activation_name, index[0])
        hook = functools.partial(
            _patch_hook, index=index, clean=clean_cache[name], setter=patch_setter
        )
        with torch.no_grad():
            logits = model.run_with_hooks(corrupted_tokens, fwd_hooks=[(name, hook)])
        out[n] = float(patching_metric(logits))
    out = out.reshape(shape)
    if return_index_df:
        return out, index_df
    return out


def _patch_hook(
    activation: Tensor, hook: Any, index: tuple[int, ...], clean: Tensor, setter: Setter
) -> Tensor:
    return setter(activation.clone(), index, clean.to(activation.device))


def _axis_sizes(model: Any, tokens: Tensor, activation_name: str) -> dict[str, int]:
    n_pos, n_heads = tokens.shape[-1], model.cfg.n_heads
    if activation_name in ("k", "v"):  # grouped-query attention: one per key/value head
        n_heads = model.cfg.n_kv_heads
    sizes = {"layer": model.cfg.n_layers, "pos": n_pos, "head": n_heads, "head_index": n_heads}
    return {**sizes, "src_pos": n_pos, "dest_pos": n_pos}


def _check_order(corrupted_tokens: object, clean_cache: object) -> None:
    if not isinstance(clean_cache, Mapping):
        raise TypeError(
            f"clean_cache must be an ActivationCache, got {type(clean_cache).__name__}. "
            f"TransformerLens's order is (model, corrupted_tokens, clean_cache, "
            f"patching_metric); analysis.activation_patch takes (model, clean_tokens, "
            f"corrupted_tokens, metric)"
        )
    if not isinstance(corrupted_tokens, Tensor):
        raise TypeError(
            f"corrupted_tokens must be token ids, got {type(corrupted_tokens).__name__}"
        )


# ---------------------------------------------------------------------- the batched engine
def _scalar_per_variant(metric: Metric, n_prompts: int) -> Metric:
    """TL's metric (one number for a batch of prompts) as ours (one number per prompt).

    The engine stacks patched variants along the batch axis, each variant's prompts
    together and in order; each variant's block of rows gets TL's number for it.
    """

    def per_prompt(logits: Float[Tensor, "rows pos d_vocab_out"]) -> Float[Tensor, " rows"]:
        if logits.shape[0] % n_prompts:
            raise AssertionError(f"{logits.shape[0]} rows is not a multiple of {n_prompts}")
        values = [
            torch.as_tensor(metric(block), dtype=torch.float64).reshape(())
            for block in logits.split(n_prompts)
        ]
        return torch.stack(values).repeat_interleave(n_prompts).to(logits.device)

    return per_prompt


def _sweep(
    model: Any, corrupted_tokens: Tensor, clean_cache: Any, metric: Metric, kind: str, by_pos: bool
) -> Tensor | None:
    """`analysis.activation_patch` when the clean tokens are known; None where they are not
    (a cache from elsewhere, or of another model or shape), for TL's loop to run instead."""
    corrupted = corrupted_tokens if corrupted_tokens.ndim == 2 else corrupted_tokens[None]
    clean = getattr(clean_cache, "tokens", None)
    same_model = getattr(clean_cache, "model", None) is model
    if clean is None or not same_model or clean.shape != corrupted.shape:
        return None
    result = analysis.activation_patch(
        model,
        kind=kind,
        clean_tokens=clean,
        corrupted_tokens=corrupted,
        metric=_scalar_per_variant(metric, corrupted.shape[0]),
        by_pos=by_pos,
    )
    return result.per_prompt[..., 0].to(torch.float32)


# ---------------------------------------------------------------------- TL's functions
@dataclass(frozen=True)
class _Patch:
    """One of TL's `get_act_patch_*`: the activation, how TL's loop indexes it, its doc.

    `by_pos` is the engine's option (None: TL's loop only); `engine_to_tl` rearranges the
    engine's axes (`[layer pos head]`) where TL orders them otherwise.
    """

    kind: str
    by_pos: bool | None
    setter: Setter
    axes: tuple[str, ...]
    doc: str
    engine_to_tl: str | None = None


_RESID = ("layer", "pos")
_HEAD_PARTS = (("out", "z", "output"), ("q", "q", "query"), ("k", "k", "key"), ("v", "v", "value"))
# (suffix, the engine's by_pos, TL's setter and axes, what the docstring says)
_HEAD_POSITIONS = (
    ("by_pos", True, layer_pos_head_vector_patch_setter, ("layer", "pos", "head"),
     "at each position"),
    ("all_pos", False, layer_head_vector_patch_setter, ("layer", "head"),
     "at every position at once"),
)  # fmt: skip
_PATCHES: dict[str, _Patch] = {
    "get_act_patch_resid_pre": _Patch(
        "resid_pre", True, layer_pos_patch_setter, _RESID,
        "Patch the residual stream entering each block at each position: `[layer pos]`.",
    ),
    "get_act_patch_resid_mid": _Patch(
        "resid_mid", True, layer_pos_patch_setter, _RESID,
        "Patch the residual stream between attention and MLP: `[layer pos]`.",
    ),
    "get_act_patch_attn_out": _Patch(
        "attn_out", True, layer_pos_patch_setter, _RESID,
        "Patch each attention layer's output at each position: `[layer pos]`.",
    ),
    "get_act_patch_mlp_out": _Patch(
        "mlp_out", True, layer_pos_patch_setter, _RESID,
        "Patch each MLP layer's output at each position: `[layer pos]`.",
    ),
    **{
        f"get_act_patch_attn_head_{part}_{positions}": _Patch(
            kind, by_pos, setter, axes, f"Patch each head's {what} {where}: `[{' '.join(axes)}]`."
        )
        for part, kind, what in _HEAD_PARTS
        for positions, by_pos, setter, axes, where in _HEAD_POSITIONS
    },
    "get_act_patch_attn_head_pattern_all_pos": _Patch(
        "pattern", False, layer_head_pattern_patch_setter, ("layer", "head_index"),
        "Patch each head's whole attention pattern: `[layer head]`.",
    ),
    "get_act_patch_attn_head_pattern_by_pos": _Patch(
        "pattern", True, layer_head_pos_pattern_patch_setter,
        ("layer", "head_index", "dest_pos"),
        "Patch each head's attention pattern one query (destination) position at a time: "
        "`[layer head dest_pos]`.",
        engine_to_tl="layer pos head -> layer head pos",
    ),
    "get_act_patch_attn_head_pattern_dest_src_pos": _Patch(
        "pattern", None, layer_head_dest_src_pos_pattern_patch_setter,
        ("layer", "head_index", "dest_pos", "src_pos"),
        "Patch each single attention weight: `[layer head dest_pos src_pos]` (TL's loop).",
    ),
}  # fmt: skip


def _run(
    spec: _Patch, model: Any, corrupted_tokens: Any, clean_cache: Any, metric: Metric
) -> Tensor:
    """One of TL's sweeps: on the batched engine where it can run, else TL's loop."""
    _check_order(corrupted_tokens, clean_cache)
    swept = None
    if spec.by_pos is not None:
        swept = _sweep(model, corrupted_tokens, clean_cache, metric, spec.kind, spec.by_pos)
    if swept is None:
        return generic_activation_patch(
            model, corrupted_tokens, clean_cache, metric, spec.setter, spec.kind, spec.axes
        )
    return rearrange(swept, spec.engine_to_tl) if spec.engine_to_tl else swept


def _function(name: str) -> Callable[..., Tensor]:
    """TL's function `name`, as `_PATCHES` describes it."""
    spec = _PATCHES[name]

    def patch(
        model: Any, corrupted_tokens: Any, clean_cache: Any, patching_metric: Metric
    ) -> Tensor:
        return _run(spec, model, corrupted_tokens, clean_cache, patching_metric)

    patch.__name__ = patch.__qualname__ = name
    arguments = "Arguments: `(model, corrupted_tokens, clean_cache, patching_metric)`."
    patch.__doc__ = f"{spec.doc}\n\n{arguments}"
    return patch


get_act_patch_resid_pre = _function("get_act_patch_resid_pre")
get_act_patch_resid_mid = _function("get_act_patch_resid_mid")
get_act_patch_attn_out = _function("get_act_patch_attn_out")
get_act_patch_mlp_out = _function("get_act_patch_mlp_out")
get_act_patch_attn_head_out_by_pos = _function("get_act_patch_attn_head_out_by_pos")
get_act_patch_attn_head_out_all_pos = _function("get_act_patch_attn_head_out_all_pos")
get_act_patch_attn_head_q_by_pos = _function("get_act_patch_attn_head_q_by_pos")
get_act_patch_attn_head_q_all_pos = _function("get_act_patch_attn_head_q_all_pos")
get_act_patch_attn_head_k_by_pos = _function("get_act_patch_attn_head_k_by_pos")
get_act_patch_attn_head_k_all_pos = _function("get_act_patch_attn_head_k_all_pos")
get_act_patch_attn_head_v_by_pos = _function("get_act_patch_attn_head_v_by_pos")
get_act_patch_attn_head_v_all_pos = _function("get_act_patch_attn_head_v_all_pos")
get_act_patch_attn_head_pattern_all_pos = _function("get_act_patch_attn_head_pattern_all_pos")
get_act_patch_attn_head_pattern_by_pos = _function("get_act_patch_attn_head_pattern_by_pos")
get_act_patch_attn_head_pattern_dest_src_pos = _function(
    "get_act_patch_attn_head_pattern_dest_src_pos"
)


# ---------------------------------------------------------------------- TL's stacks
def _every_head_part(
    model: Any, corrupted_tokens: Any, clean_cache: Any, metric: Metric, positions: str
) -> Tensor:
    """Output, query, key, value and pattern of every head (`positions`: "by_pos" or
    "all_pos"), stacked in TL's layout: `[5 layer ...]`, the pattern's axes as the others'."""
    parts = []
    for part in ("out", "q", "k", "v", "pattern"):
        spec = _PATCHES[f"get_act_patch_attn_head_{part}_{positions}"]
        result = _run(spec, model, corrupted_tokens, clean_cache, metric)
        if part in ("k", "v"):
            result = _per_query_head(model, result)
        if part == "pattern" and positions == "by_pos":
            result = rearrange(result, "layer head pos -> layer pos head")
        parts.append(result)
    return torch.stack(parts)


def get_act_patch_attn_head_all_pos_every(
    model: Any, corrupted_tokens: Any, clean_cache: Any, metric: Metric
) -> Float[Tensor, "patch_type layer head"]:
    """Output, query, key, value and pattern of every head, all positions: `[5 layer head]`."""
    return _every_head_part(model, corrupted_tokens, clean_cache, metric, "all_pos")


def get_act_patch_attn_head_by_pos_every(
    model: Any, corrupted_tokens: Any, clean_cache: Any, metric: Metric
) -> Float[Tensor, "patch_type layer pos head"]:
    """Output, query, key, value and pattern of every head by position: `[5 layer pos head]`."""
    return _every_head_part(model, corrupted_tokens, clean_cache, metric, "by_pos")


def _per_query_head(model: Any, results: Tensor) -> Tensor:
    """Key/value results `[... kv_head]` zero-padded to `[... head]`, as TL stacks them
    for grouped-query attention (entries past the key/value heads are 0, not results)."""
    missing = model.cfg.n_heads - results.shape[-1]
    return torch.nn.functional.pad(results, (0, missing))


def get_act_patch_block_every(
    model: Any, corrupted_tokens: Any, clean_cache: Any, metric: Metric
) -> Float[Tensor, "patch_type layer pos"]:
    """The stream entering each block, each attention output, each MLP output: `[3 layer pos]`."""
    return torch.stack(
        [
            get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_attn_out(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_mlp_out(model, corrupted_tokens, clean_cache, metric),
        ]
    )
