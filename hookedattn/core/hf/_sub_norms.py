"""Norms inside a sublayer (BitNet's), recognised for the importer by convention.

BitNet's attention norms the heads' outputs, concatenated, before its output map
(`attn_sub_norm`, over `(head d_head)`); its MLP norms the gated neurons before its down map
(`ffn_sub_norm`, over `d_mlp`). Ours are `attn.sub_norm` (behind `hook_z_normed`) and
`mlp.ln` (`HookedTransformerConfig.attn_sub_norm`, `mlp_sub_norm`). They are found by these
names and their widths; where they sit in the sublayer's forward is not read off the module
tree, so the verification against `transformers` is what accepts them. Only the plain RMS
norm is read here (the kind every norm of the model shares, `_probes.norm_kind`).
"""

from typing import Any

from torch import nn

from hookedattn.core.hf._table import Rule

ATTN_SUB_NORMS = ("attn_sub_norm",)
MLP_SUB_NORMS = ("ffn_sub_norm",)


def sub_norm(module: nn.Module, names: tuple[str, ...], width: int) -> str | None:
    """The name of `module`'s norm among `names` (None without one); a ValueError where its
    gain is not `width` wide."""
    name = next((n for n in names if isinstance(getattr(module, n, None), nn.Module)), None)
    if name is None:
        return None
    gain = getattr(getattr(module, name), "weight", None)
    if gain is None or tuple(gain.shape) != (width,):
        shape = None if gain is None else tuple(gain.shape)
        raise ValueError(
            f"{type(module).__name__}.{name} has a gain of shape {shape}, not ({width},): "
            f"not a norm over the sublayer's {width} dimensions"
        )
    return name


def fields(anatomy: Any) -> dict[str, bool]:
    """Our config's sub-norm flags (none where the model has neither)."""
    found = {"attn_sub_norm": anatomy.attn_sub_norm is not None,
             "mlp_sub_norm": anatomy.mlp_sub_norm is not None}  # fmt: skip
    return {name: True for name, there in found.items() if there}


def rules(anatomy: Any) -> list[Rule]:
    """The sub-norms' gains (unexpanded); a ValueError for a norm kind other than RMS."""
    if anatomy.attn_sub_norm is None and anatomy.mlp_sub_norm is None:
        return []
    if anatomy.norm_kind != "rms":
        raise ValueError(f"sub-norms of kind {anatomy.norm_kind!r}: only RMS norms with a "
                         "gain ('rms') are read inside a sublayer")  # fmt: skip
    at = f"{anatomy.layers}.{{layer}}"
    out = []
    if anatomy.attn_sub_norm:
        out.append(Rule("blocks.{layer}.attn.sub_norm.w",
                        f"{at}.{anatomy.attn}.{anatomy.attn_sub_norm}.weight",
                        "(head d_head) -> head d_head"))  # fmt: skip
    if anatomy.mlp_sub_norm:
        out.append(Rule("blocks.{layer}.mlp.ln.w",
                        f"{at}.{anatomy.mlp}.{anatomy.mlp_sub_norm}.weight",
                        "d_mlp -> d_mlp"))  # fmt: skip
    return out
