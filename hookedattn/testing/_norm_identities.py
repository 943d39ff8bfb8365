"""The norms before a sublayer, written out from their input: divisor and normalised stream.

    <norm>.hook_scale      == sqrt(mean(centre(x)^2) + eps)     over the norm's axes
    <norm>.hook_normalized == centre(x) / <norm>.hook_scale

with `x` the activation the norm reads (`resid_pre` for `ln1`, `resid_mid` or `mlp_in` for
`ln2`, the last `resid_post` for `ln_final`, `hook_q` and `hook_k` for the q/k norms,
`hook_mid` for a `solu_ln` MLP's `mlp.ln`, a LayerNorm over the neurons whatever the
model's norms, or a sub-normed MLP's (`mlp_sub_norm`, of the model's kind), `hook_z` for
the heads' sub-norm `attn.sub_norm`, over every head's dimensions), `centre` the mean
removed for LayerNorm (`normalization_type` "LN", "LNPre"; Ba et al. 2016) and the
identity for RMSNorm (Zhang & Sennrich 2019; the q/k norms are RMS), and `eps` the
published constant (`hookedattn.testing.published`), not the model's. Written from the
formulas, never by calling the model's norm modules. A norm whose input is not cached
(after a sublayer: its input is the sublayer's output before it) is not listed here; its
gain, bias and centring are checked at its recorded divisor elsewhere.
"""

from hookedattn.core import names as _names
from hookedattn.core.components.norm import NoNorm
from hookedattn.core.model import HookedTransformer
from hookedattn.testing._identity import VALUE, Get, Identity, Sides
from hookedattn.testing.published import Constants


def input_norm_identities(model: HookedTransformer, constants: Constants) -> list[Identity]:
    """The two identities of every norm whose input is cached, in forward order."""
    cfg = model.cfg
    centres = cfg.normalization_type in ("LN", "LNPre")
    out = []
    for layer, block in enumerate(model.blocks):
        read_ln1 = _ln1_input(block, layer)
        if read_ln1 is not None and _holds_norm(block, "ln1"):
            out += _norm(f"blocks.{layer}.ln1", read_ln1, 1, centres, constants.eps)
        if cfg.use_qk_norm and hasattr(block, "attn"):
            axes = 1 if cfg.qk_norm_per_head else 2
            after = cfg.qk_norm_after_rotary and cfg.layer_rotates(layer)  # rotated q, k
            for which, x in (("q_norm", "rot_q" if after else "q"),
                             ("k_norm", "rot_k" if after else "k")):  # fmt: skip
                path = f"blocks.{layer}.attn.{which}"
                centred = cfg.qk_norm_type == "LN"
                out += _norm(path, _act(x, layer), axes, centred, constants.eps)
        if _holds_norm(block, "ln2"):
            out += _norm(f"blocks.{layer}.ln2", _ln2_input(block, layer), 1, centres, constants.eps)
        if cfg.attn_sub_norm and hasattr(block, "attn"):  # BitNet's: over every head's z together
            out += _norm(f"blocks.{layer}.attn.sub_norm", _act("z", layer), 2, centres,
                         constants.eps)  # fmt: skip
        if hasattr(getattr(block, "mlp", None), "hook_mid"):  # solu_ln: a LayerNorm, always
            centred = centres if cfg.mlp_sub_norm else True  # BitNet's: the model's kind
            out += _norm(f"blocks.{layer}.mlp.ln", _act("mid", layer), 1, centred, constants.eps)
    if not isinstance(model.ln_final, NoNorm):
        final = _act("resid_post", cfg.n_layers - 1)
        out += _norm("ln_final", final, 1, centres, constants.eps)
    return out


def _holds_norm(block: object, name: str) -> bool:
    """Whether `block` has the norm `name` (a hybrid's block of one sublayer lacks the
    other's) and it is not the identity."""
    module = getattr(block, name, None)
    return module is not None and not isinstance(module, NoNorm)


def _ln1_input(block: object, layer: int) -> str | None:
    """What `ln1` reads: the stream, or its per-head copies; None with split q/k/v inputs
    (`ln1` runs three times and its hook points keep only the last)."""
    if hasattr(block, "hook_q_input"):
        return None
    copies = [name for name in ("attn_in", "mixer_in") if hasattr(block, f"hook_{name}")]
    return _act(copies[0] if copies else "resid_pre", layer)


def _ln2_input(block: object, layer: int) -> str:
    if hasattr(block, "hook_mlp_in"):
        return _act("mlp_in", layer)
    parallel = not hasattr(block, "hook_resid_mid")
    return _act("resid_pre" if parallel else "resid_mid", layer)


def _norm(path: str, x: str, n_axes: int, centres: bool, eps: float) -> list[Identity]:
    scale, normalized = f"{path}.hook_scale", f"{path}.hook_normalized"
    axes = tuple(range(-n_axes, 0))
    square, centre = ("(x - mean(x))^2", "x - mean(x)") if centres else ("x^2", "x")

    def centred(get: Get):
        value = get(x)
        return value - value.mean(axes, keepdim=True) if centres else value

    def scale_sides(get: Get) -> Sides:
        expected = (centred(get).pow(2).mean(axes, keepdim=True) + eps).sqrt()
        return Sides(get(scale), expected, expected)

    def normalized_sides(get: Get) -> Sides:
        expected = centred(get) / get(scale)
        return Sides(get(normalized), expected, expected.abs())

    scale_is = f"{scale} == sqrt(mean({square}) + {eps:g}) of x = {x}"
    normalized_is = f"{normalized} == ({centre}) / {scale} of x = {x}"
    needs = (normalized, x, scale)
    return [
        Identity(scale_is, (scale, x), (), VALUE, scale_sides),
        Identity(normalized_is, needs, _names.axis_names(normalized), VALUE, normalized_sides),
    ]


def _act(name: str, layer: int) -> str:
    return _names.get_act_name(name, layer)
