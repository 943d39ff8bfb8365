"""TransformerLens 4's hook names, answered by this package's hook points.

TL 4's `TransformerBridge` names its hook points after the components it wraps: each
component has a `hook_in` and a `hook_out` (`blocks.0.hook_in`, `blocks.0.attn.q.hook_out`,
`blocks.0.mlp.out.hook_in`), and TL 3's names (`blocks.0.hook_resid_pre`) are aliases of
them. Here it is the other way round: our hook points carry TL 3's names, and each TL 4 name
is an alias of the one that sees the same tensor (checked by value against TL 4.3 in
tests/tl/test_tl_bridge.py). `bridge_aliases(hook_dict, n_layers)` lists the aliases a
model's hook points can answer; `UNAVAILABLE` the TL 4 names no hook point here sees.
"""

import re
from collections.abc import Iterable, Mapping

# TL 4 name inside block i -> our name inside block i. A component's input is the output
# of what feeds it: q, k and v read ln1's output, the MLP reads ln2's, ln2 reads resid_mid.
_BLOCK: dict[str, str] = {
    "hook_in": "hook_resid_pre",
    "hook_out": "hook_resid_post",
    "ln1.hook_in": "hook_resid_pre",
    "attn.hook_in": "ln1.hook_out",
    **{f"attn.{p}.hook_in": "ln1.hook_out" for p in "qkv"},
    **{f"attn.{p}.hook_out": f"attn.hook_{p}" for p in "qkv"},
    "attn.o.hook_in": "attn.hook_z",
    "attn.o.hook_out": "hook_attn_out",
    "attn.hook_out": "hook_attn_out",
    "attn.hook_hidden_states": "hook_attn_out",
    "ln2.hook_in": "hook_resid_mid",
    "mlp.hook_in": "ln2.hook_out",
    "mlp.in.hook_in": "ln2.hook_out",
    "mlp.out.hook_in": "mlp.hook_post",
    "mlp.out.hook_out": "hook_mlp_out",
    "mlp.hook_out": "hook_mlp_out",
}
# The MLP's first linear map: TL 4's `in` is the ungated one in a gated MLP (`gate` the
# gated one), whose pre-activations TL 3 calls hook_pre_linear (and hook_pre).
_PLAIN_MLP = {"mlp.in.hook_out": "mlp.hook_pre"}
_GATED_MLP = {
    "mlp.gate.hook_in": "ln2.hook_out",
    "mlp.gate.hook_out": "mlp.hook_pre",
    "mlp.in.hook_out": "mlp.hook_pre_linear",
}
_GLOBAL: dict[str, str] = {
    "embed.hook_out": "hook_embed",
    "pos_embed.hook_out": "hook_pos_embed",
    "hook_unembed": "unembed.hook_out",
}

# TL 4 names with no hook point here, and what to use instead.
UNAVAILABLE: dict[str, str] = {
    "embed.hook_in": "the token ids themselves (the tensor you pass in, or "
    "model.to_tokens(text)); hook_embed (embed.hook_out) is the embedding",
    "pos_embed.hook_in": "torch.arange(n_pos) (the positions); hook_pos_embed "
    "(pos_embed.hook_out) is the positional embedding",
    "attn.qkv.hook_in": "blocks.{layer}.ln1.hook_out (the input of the fused QKV map)",
    "attn.qkv.hook_out": "blocks.{layer}.attn.hook_q, hook_k and hook_v (the fused map's "
    "three outputs, per head)",
    "rotary_emb.hook_in": "hook_embed (the rotary table reads the embeddings only for their "
    "dtype and device)",
    **{
        f"{where}.hook_{part}": "model.blocks[layer].attn.rotary.cos_sin(positions, dtype) "
        "(the angles are computed, not hooked; hook_rot_q and hook_rot_k are the rotated "
        "queries and keys)"
        for where in ("rotary_emb", "attn")
        for part in ("cos", "sin")
    },
}
_BLOCK_NAME = re.compile(r"^blocks\.(\d+)\.(.+)$")


def bridge_aliases(hook_dict: Mapping[str, object], n_layers: int, gated_mlp: bool) -> dict:
    """Every TL 4 name whose tensor one of `hook_dict`'s hook points sees, mapped to that
    point's name; names whose target is absent (no resid_mid in a parallel block, no MLP in
    an attention-only model) are left out."""
    aliases = {a: ours for a, ours in _GLOBAL.items() if ours in hook_dict}
    if n_layers and f"blocks.{n_layers - 1}.hook_resid_post" in hook_dict:
        aliases["ln_final.hook_in"] = f"blocks.{n_layers - 1}.hook_resid_post"
    block = _BLOCK | (_GATED_MLP if gated_mlp else _PLAIN_MLP)
    for layer in range(n_layers):
        for tl4, ours in block.items():
            target = f"blocks.{layer}.{ours}"
            if target in hook_dict:
                aliases[f"blocks.{layer}.{tl4}"] = target
    return aliases


def unavailable_message(name: str) -> str | None:
    """Why the TL 4 hook name `name` has no hook point here and what to use instead, or None
    when it is not one of those."""
    match = _BLOCK_NAME.match(name)
    layer, local = (match.group(1), match.group(2)) if match else (None, name)
    instead = UNAVAILABLE.get(local)
    if instead is None:
        return None
    return (
        f"{name!r} is a TransformerBridge (TransformerLens 4) hook point that hookedattn_tl "
        f"does not have; use {instead.format(layer=layer)}"
    )


def inverse(aliases: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Our name -> the TL 4 names that are aliases of it."""
    out: dict[str, list[str]] = {}
    for alias, ours in aliases.items():
        out.setdefault(ours, []).append(alias)
    return {ours: tuple(names) for ours, names in out.items()}


class AliasedHookDict(dict):
    """A model's `hook_dict` (our names, in forward order) that also answers TL 4's names:
    `hook_dict["blocks.0.hook_in"] is hook_dict["blocks.0.hook_resid_pre"]`. Iterating,
    `keys()` and `len()` see our names only, each hook point once."""

    def __init__(self, points: Mapping[str, object], aliases: Mapping[str, str]) -> None:
        super().__init__(points)
        self.aliases = dict(aliases)

    def __getitem__(self, name: object) -> object:
        return super().__getitem__(self.aliases.get(name, name))

    def __contains__(self, name: object) -> bool:
        return super().__contains__(self.aliases.get(name, name))

    def get(self, name: object, default: object = None) -> object:
        """The hook point at `name` (ours or a TL 4 alias), or `default`."""
        return super().get(self.aliases.get(name, name), default)


def accepts(predicate, name: str, aliases: Iterable[str]) -> bool:
    """Whether a names filter accepts the hook point `name` under its own name or any of
    its TL 4 aliases (TL 4 filters see both spellings)."""
    return bool(predicate(name)) or any(predicate(a) for a in aliases)


__all__ = ["UNAVAILABLE", "AliasedHookDict", "accepts", "bridge_aliases", "unavailable_message"]
