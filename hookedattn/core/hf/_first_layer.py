"""A first decoder layer without the norm the others read the attention's input through:
ModernBERT-decoder's first layer keeps an `nn.Identity` in its `attn_norm`'s place, its
embeddings being normed already. Its pieces are read off the second layer; the norm, which
must be our `ln1`, becomes the identity in block 0 (`ln1_layers`), whose rules are left out.
"""

from typing import Any

from torch import nn

from hookedattn.core.hf._table import Rule


def identities_in_first(layers: list[nn.Module]) -> tuple[str, ...]:
    """The children that are `nn.Identity` in the first layer and hold parameters in every
    other one (none where there is one layer)."""
    if len(layers) < 2:
        return ()
    first = dict(layers[0].named_children())
    return tuple(
        name
        for name, module in first.items()
        if isinstance(module, nn.Identity)
        and all(any(True for _ in getattr(layer, name).parameters())
                for layer in layers[1:] if hasattr(layer, name))
        and all(hasattr(layer, name) for layer in layers[1:])
    )  # fmt: skip


def ln1_fields(anatomy: Any, n_layers: int) -> dict[str, Any]:
    """`ln1_layers` where the first layer's attention reads its input un-normed; a norm
    other than the one before the attention missing from it is a ValueError naming it."""
    if not anatomy.first_identities:
        return {}
    ours = {hf: name for name, hf in anatomy.norms}
    others = [n for n in anatomy.first_identities if ours.get(n) != "ln1"]
    if others:
        raise ValueError(
            f"the first layer holds an identity in place of {others}: only the norm before "
            f"the attention (ln1: {dict(anatomy.norms).get('ln1')}) may be missing from it"
        )
    return {"ln1_layers": (False,) + (True,) * (n_layers - 1)}


def without_first_ln1(rules: list[Rule], anatomy: Any) -> list[Rule]:
    """The expanded rules but block 0's `ln1`'s, where that norm is the identity."""
    if not anatomy.first_identities:
        return rules
    return [rule for rule in rules if not rule.ours.startswith("blocks.0.ln1.")]
