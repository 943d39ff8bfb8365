"""A hybrid model's mixer, as far as its hook points show it from outside:

    mixer.hook_in  == ln1.hook_out              what it reads: the normed stream
    attn_out       == ln1_post(mixer.hook_out)  what its block adds (a mixer in attention's
                                                place); hook_mixer_out == mixer.hook_out
                                                beside the attention (Falcon-H1)
    hook_mixing, hook_pattern                   0 on every key after its query (the mixing
                                                matrix of Mamba-2 and the gated delta net,
                                                lightning attention's decayed pattern)
    o              == pattern @ v               the heads' reads: lightning attention's, and
                                                the gated delta net's (its mixing)

The mixers' own equations (the scans, the delta rule) are checked against recurrences
written out in the tests (`tests/core/test_mixers.py`); their intermediate values are not
all hook points, so they are not identities of a cache.
"""

from hookedattn.core import names as _names
from hookedattn.core.components.norm import NoNorm
from hookedattn.core.model import HookedTransformer
from hookedattn.testing import _attention_identities as attn_ids
from hookedattn.testing._identity import VALUE, Get, Identity, NormAtScale, Sides, sum_of


def mixer_identities(model: HookedTransformer, layer: int, beside: bool) -> list[Identity]:
    """The identities of block `layer`'s mixer: in attention's place, or (`beside`) beside
    the attention, writing `hook_mixer_out` straight into the stream."""
    block = model.blocks[layer]
    prefix = f"blocks.{layer}.mixer"
    if not isinstance(block.ln1, NoNorm):
        read = f"blocks.{layer}.ln1.hook_out"
    else:
        read = _names.get_act_name("mixer_in" if hasattr(block, "hook_mixer_in") else "resid_pre",
                                   layer)  # fmt: skip
    out = [sum_of(f"{prefix}.hook_in", read)]
    if beside:
        out.append(sum_of(f"blocks.{layer}.hook_mixer_out", f"{prefix}.hook_out"))
    else:
        out.append(_written(model, layer, f"{prefix}.hook_out"))
    for name in ("hook_mixing", "hook_pattern"):
        if not hasattr(block.mixer, name):
            continue
        out.append(attn_ids.causal(f"{prefix}.{name}"))
        if hasattr(block.mixer, "hook_o") and hasattr(block.mixer, "hook_v"):
            reads = f"{prefix}.hook_o", f"{prefix}.{name}", f"{prefix}.hook_v"
            out.append(attn_ids.mix_values(*reads, 1))
    return out


def _written(model: HookedTransformer, layer: int, mixed: str) -> Identity:
    """`attn_out == ln1_post(mixed)`, the norm after the mixer at its recorded divisor (or
    none)."""
    attn_out = _names.get_act_name("attn_out", layer)
    module = model.blocks[layer].ln1_post
    if isinstance(module, NoNorm):
        return sum_of(attn_out, mixed)
    post = NormAtScale(f"blocks.{layer}.ln1_post", module)

    def sides(get: Get) -> Sides:
        x = get(mixed)
        expected, size = post.apply(get, x, x.abs())
        return Sides(get(attn_out), expected, size)

    statement = f"{attn_out} == {post.path}({mixed})"
    return Identity(statement, (attn_out, mixed, post.scale), _names.axis_names(attn_out),
                    VALUE, sides)  # fmt: skip
