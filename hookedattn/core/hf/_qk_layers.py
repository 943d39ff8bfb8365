"""Llama 4's per-block attention variants, for the importer by convention.

Llama 4's text blocks differ from one another in their attention only (its MLPs differ as
any interleaved mixture's do, `_moe_layers`): the blocks that rotate (`no_rope_layers`: 1)
norm their queries and keys by an RMS norm without a gain (`use_qk_norm`: one weightless
module `qk_norm` for both) and attend within fixed chunks (`layer_types`
"chunked_attention", `attention_chunk_size`); the others do neither and scale their queries
by position (`attn_temperature_tuning`, `floor_scale`, `attn_scale`). Read here:

    the anatomy  a layer may lack a q/k norm the first holds where the norm holds no
                 parameter (`weightless_norms`): which layers hold one (`held_by`) must be
                 every layer or the rotating ones (`pattern`)
    the fields   `qk_norm_layers` (the rotating blocks, where they alone norm), `window_size`,
                 `window_chunked` and `attn_types` from the chunked layers, and the query
                 temperature (`fields`)

What the twin cannot tell apart (the temperature is 1 on its first positions, so its twin's
`floor_scale` is shrunk: `_tiny.OVERRIDES`) the verification on load still checks.
"""

from typing import Any

from torch import nn

from hookedattn.core.hf._roles import QK_NORMS

_NAMES = frozenset(QK_NORMS["q_norm"] + QK_NORMS["k_norm"])


def weightless_norms(shapes: dict[str, tuple[str, tuple[int, ...]]]) -> dict[str, Any]:
    """A layer's module shapes (`_anatomy._shapes`) without its q/k norms that hold no
    parameter: a layer without them is otherwise alike."""
    return {
        name: shape
        for name, shape in shapes.items()
        if not (name.rsplit(".", 1)[-1] in _NAMES and shape[1] == ())
    }


def held_by(
    layers: list[nn.Module], attn: str, names: tuple[str, str] | None
) -> tuple[bool | None, ...]:
    """Which `layers` hold the q/k norms `names` in their attention `attn` (None: a layer
    without that attention, a hybrid's mixer layer)."""
    return tuple(
        None
        if not _holds(layer, attn)
        else names is not None and _holds(layer, f"{attn}.{names[0]}")
        for layer in layers
    )


def _holds(layer: nn.Module, name: str) -> bool:
    try:
        layer.get_submodule(name)
    except AttributeError:
        return False
    return True


def pattern(held: tuple[bool | None, ...], config: Any) -> str:
    """Which attending layers (`held_by`: not None) hold q/k norms, as a config says it:
    "all", or "rotating" where they are the layers `no_rope_layers` rotates; a ValueError
    names them otherwise."""
    attending = [i for i, h in enumerate(held) if h is not None]
    if all(held[i] for i in attending):
        return "all"
    rotating = tuple(bool(f) for f in (getattr(config, "no_rope_layers", None) or ()))
    if len(rotating) >= len(held) and all(rotating[i] == held[i] for i in attending):
        return "rotating"
    raise ValueError(
        f"q/k norms in layers {[i for i, h in enumerate(held) if h]} only, which no config "
        "field gives (recognised: every layer, or the rotating ones of no_rope_layers)"
    )


def is_weightless(module: nn.Module) -> bool:
    """Whether a q/k norm holds no parameter (Llama 4's: an RMS norm without a gain)."""
    return not any(True for _ in module.parameters())


def fields(c: Any, qk_norm_on: str) -> dict[str, Any]:
    """Our config's fields of Llama 4's per-block attention (module docstring), none where
    `c` has no such setting; `qk_norm_on`: the anatomy's (`pattern`)."""
    out: dict[str, Any] = {}
    if qk_norm_on == "rotating":
        n = int(c.num_hidden_layers)
        out["qk_norm_layers"] = tuple(bool(f) for f in c.no_rope_layers[:n])
    types = tuple(getattr(c, "layer_types", None) or ())
    chunk = getattr(c, "attention_chunk_size", None)
    if "chunked_attention" in types and chunk is not None:
        out |= {
            "window_size": int(chunk),
            "window_chunked": True,
            "attn_types": tuple("local" if t == "chunked_attention" else "global" for t in types),
        }
    if getattr(c, "attn_temperature_tuning", False):
        out |= {
            "query_temperature_floor": int(c.floor_scale),
            "query_temperature_scale": float(c.attn_scale),
        }
    return out
