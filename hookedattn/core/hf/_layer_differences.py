"""Whether a twin's decoder layers are alike, and what differs between them, named for the
refusal of an architecture whose layers are not (`held_experts`, `_anatomy`'s check).

A convention reads one layer and builds every block from it, so a layer unlike the first of
its kind is refused. The refusal names what differs, so that it says which piece is
missing rather than only that one is: each module whose class or weight shape differs (in
the first layer that differs, against the first layer of its kind), the per-layer
overrides of the config (`transformers`' heterogeneous configs keep them in
`per_layer_config`: wider heads in some layers, `head_dim`, fewer key/value heads,
`num_key_value_heads`; Gemma 4's family, `_gemma4`, reads them), and the pieces the config
names that no convention imports. The last are named by the config fields that build them:
per-layer input embeddings (`hidden_size_per_layer_input`: Gemma 3n's small models add,
after each layer, a gated projection of an embedding of the token of that layer's own;
Gemma 4's family imports them), layers that reuse an earlier layer's keys and values
(`num_kv_shared_layers`), keys serving as values (`attention_k_eq_v`) and a mixture of
experts beside the dense MLP (`enable_moe_block`).
"""

from typing import Any

from torch import nn

from hookedattn.core.hf import _experts, _qk_layers

# Config fields that build a piece no convention imports, and the piece, in words.
UNIMPORTED_PIECES = (
    ("hidden_size_per_layer_input", "per-layer input embeddings"),
    ("num_kv_shared_layers", "layers reusing earlier layers' keys and values"),
    ("attention_k_eq_v", "keys serving as values"),
    ("enable_moe_block", "a mixture of experts beside the dense MLP"),
)
_SHOWN = 3  # modules named per differing layer: enough to say what differs, not a dump


def held_experts(
    layers: list[nn.Module],
    sublayers: tuple[str, tuple[str, ...]],
    first_identities: tuple[str, ...],
    attending: list[int],
    config: Any,
) -> tuple[bool, ...]:
    """Which layers hold a mixture of experts where the others hold a dense MLP, in any
    pattern (DeepSeek's dense first layers, Jamba's every other: `_moe_layers`); any other
    difference between the layers is a ValueError naming it (`described`), but for a
    hybrid's attention or mixer (`sublayers`: the MLP's child name, the mixing children's),
    as is a mixture or a dense MLP unlike the first of its kind. `attending`: the layers
    that attend, where others mix."""
    mlp, mixing = sublayers
    # A hybrid may build its attention and its mixer layers of two classes (Jamba's).
    ignored = (mlp, *mixing, *(("",) if mixing else ()), *first_identities)

    def without_mlp(layer: nn.Module) -> dict[str, Any]:
        shapes = _qk_layers.weightless_norms(_every_shape(layer))  # Llama 4's, in some layers
        return {n: v for n, v in shapes.items() if n.split(".")[0] not in ignored}

    # Each layer against the first of its kind: a hybrid's mixer layers may place their
    # norms otherwise than its attention layers (OLMo Hybrid's: `_mixer_norms`).
    mixes = [bool(mixing) and i not in attending for i in range(len(layers))]
    firsts = {mixes[i]: without_mlp(layers[i]) for i in reversed(range(len(mixes)))}
    differing = [i for i, layer in enumerate(layers) if without_mlp(layer) != firsts[mixes[i]]]
    kinds = [_experts.block_name(dict(layer.named_children())) is not None for layer in layers]
    mlps = [_every_shape(layer.get_submodule(mlp)) for layer in layers] if mlp else []
    mixed = [i for i in range(len(mlps)) if mlps[i] != mlps[kinds.index(kinds[i])]]
    if differing or mixed:
        pair, skip = (
            ((differing[0], mixes.index(mixes[differing[0]])), ignored)
            if differing
            else ((mixed[0], kinds.index(kinds[mixed[0]])), ())
        )
        raise ValueError(
            f"decoder layers hold different pieces (layers {differing or mixed} differ "
            "from the first): a hybrid or a per-layer variant, not recognised by convention"
            f" ({described(layers, pair, skip, config)})"
        )
    return tuple(kinds)


def _every_shape(module: nn.Module) -> dict[str, tuple[str, tuple[int, ...]]]:
    # Each module's class and weight shape, the module itself (`""`) included.
    return {n: (type(m).__name__, tuple(p.shape) if (p := getattr(m, "weight", None)) is not None
                else ()) for n, m in module.named_modules()}  # fmt: skip


def described(
    layers: list[nn.Module], pair: tuple[int, int], skip: tuple[str, ...], config: Any
) -> str:
    """What differs in the layer `pair[0]` from the layer `pair[1]` (the first of its kind;
    children named in `skip` left out), the config's per-layer overrides and its
    unimported pieces, as one clause of a refusal; "" where nothing more is known."""
    index, first = pair
    parts = [_modules(layers[index], layers[first], pair, skip), _overrides(config),
             _pieces(config)]  # fmt: skip
    return "; ".join(p for p in parts if p)


def _modules(
    layer: nn.Module, first: nn.Module, pair: tuple[int, int], skip: tuple[str, ...]
) -> str:
    """The modules of `layer` whose class or weight shape differ from `first`'s."""
    index, first_index = pair
    mine, theirs = _shapes(layer, skip), _shapes(first, skip)
    # In the order the first layer builds them (a query map before the output map).
    names = [n for n in dict.fromkeys([*theirs, *mine]) if mine.get(n) != theirs.get(n)]
    said = [f"{n} {_shown(mine.get(n))} in layer {index}, {_shown(theirs.get(n))} in layer "
            f"{first_index}" for n in names[:_SHOWN]]  # fmt: skip
    more = f" (and {len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
    return ", ".join(said) + more


def _shapes(module: nn.Module, skip: tuple[str, ...]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each submodule's class and weight shape (`()` for one without a weight), but those
    under the children named in `skip`."""
    return {n: (type(m).__name__, tuple(w.shape) if (w := getattr(m, "weight", None)) is not None
                else ()) for n, m in module.named_modules()
            if n and n.split(".")[0] not in skip}  # fmt: skip


def _shown(piece: tuple[str, tuple[int, ...]] | None) -> str:
    if piece is None:
        return "absent"
    kind, shape = piece
    return f"{kind}{shape}" if shape else kind


def _overrides(config: Any) -> str:
    """The fields `per_layer_config` sets per layer, and in which layers (`to_dict`: the
    heterogeneous config refuses to read such a field as one value)."""
    per_layer = (config.to_dict() if hasattr(config, "to_dict") else {}).get("per_layer_config")
    layers_of: dict[str, list[int | str]] = {}
    for layer, fields in (per_layer or {}).items():  # keyed by layer ("05") or by layer type
        for name in fields:
            layers_of.setdefault(name, []).append(int(layer) if str(layer).isdigit() else layer)
    if not layers_of:
        return ""
    said = ", ".join(f"{name} in layers {layers}" for name, layers in layers_of.items())
    # Our config holds such shapes (`n_heads_layers`, `d_head_layers`, ...: the families of
    # MiMo-V2-Flash and Gemma 4 read them), but no convention reads them yet.
    return (f"per_layer_config sets {said}: blocks of different attention shapes are not "
            "imported by convention")  # fmt: skip


def _pieces(config: Any) -> str:
    """The unimported pieces the config asks for (`UNIMPORTED_PIECES`)."""
    asked = [f"{piece} ({field})" for field, piece in UNIMPORTED_PIECES
             if getattr(config, field, None)]  # fmt: skip
    return f"its config also asks for {', '.join(asked)}, not imported" if asked else ""
