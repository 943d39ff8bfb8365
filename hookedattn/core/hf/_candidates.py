"""The families a module tree allows: one per combination of the settings its anatomy
cannot see (which pairs a rotation turns, in which layers, the router's scoring, the gate's
function, the order of the q/k norms and the rotation, the softmax scale, the layout of a
fused q/k/v, whether a configured soft cap of the scores is applied), the likelier first.
The verification on the tiny twin (`_search`) keeps the first that computes what
`transformers` computes.
"""

import dataclasses
import itertools
from typing import Any

from hookedattn.core.hf._anatomy import recognise
from hookedattn.core.hf._convention import Convention
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._probes import Scale
from hookedattn.core.hf._recognised import UNKNOWN


def candidates(hf_config: Any, architecture: str | None = None) -> list[Family]:
    """The families the anatomy of `hf_config` allows, the likelier first: one, or for a
    rotary architecture its rotation of halves, then of pairs, then of halves turned the
    other way (module docstring), in every
    layer, then (where some layers slide a window and some do not) in the sliding ones only."""
    anatomy = recognise(hf_config, architecture)
    layouts = ("halves", "pairs", "halves_reversed") if anatomy.rotary else ("halves",)
    if anatomy.latent:  # its rules rotate halves or pairs only
        layouts = layouts[:2]
    if anatomy.latent and hasattr(hf_config, "rope_interleave"):  # DeepSeek's: it says
        layouts = ("pairs",) if hf_config.rope_interleave else ("halves",)
    types = set(getattr(hf_config, "layer_types", None) or ())
    mixed = {"full_attention", "sliding_attention"} <= types
    rotating = ("all", "sliding") if anatomy.rotary and mixed else ("all",)
    experts = anatomy.experts
    renorm = (False,) if experts is None else (True, False)
    if experts is not None and experts.norm_topk_field:
        renorm = (bool(getattr(hf_config, experts.norm_topk_field)),)
    gates = (None,) if anatomy.attn_gate_per_head is None else ("sigmoid", "softplus")
    orders = (False, True) if anatomy.qk_norm and anatomy.rotary else (False,)
    fused = anatomy.role(anatomy.attn_maps, "qkv") is not None
    heads = getattr(hf_config, "num_attention_heads", None)
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    qkv_layouts = ("stacked", "per_head") if fused and kv_heads == heads else ("stacked",)
    if fused and kv_heads == heads and heads % 4 == 0:
        qkv_layouts += ("sharded",)
    softmax = (anatomy.attn_scale,)  # kept by the module, or the usual ones (GPT-Neo: 1)
    if anatomy.attn_scale == UNKNOWN and not anatomy.latent:  # latent: the config's
        softmax = (Scale("rsqrt", "d_head"), Scale())
    scorings = _scorings(hf_config, experts)
    capped = (True, False) if getattr(hf_config, "attn_logit_softcapping", None) else (True,)
    families = []
    for on, layout, norm_topk, scoring, gate, after, scale, qkv, cap in itertools.product(
        rotating, layouts, renorm, scorings, gates, orders, softmax, qkv_layouts, capped
    ):
        chosen = dataclasses.replace(
            anatomy, rotary_layout=layout, rotary_on=on, norm_topk=norm_topk,
            router_scoring=scoring, attn_gate=gate, qk_norm_after_rotary=after,
            attn_scale=scale, qkv_layout=qkv, attn_soft_cap=cap,
        )  # fmt: skip
        convention = Convention(chosen)
        settings = (on, layout, norm_topk, scoring, gate, after, scale, qkv, cap)
        families.append(
            Family(
                anatomy.architecture,
                hf_config.model_type,
                convention.fields,
                convention.table,
                variant=repr(convention.anatomy),
                choices=tuple(zip(_CHOICES, settings, strict=True)),
            )
        )
    return families


def _scorings(hf_config: Any, experts: Any) -> tuple[str, ...]:
    """The router scorings to try, the likelier first: with a choice bias DeepSeek V3's
    sigmoid or Ernie's biased softmax; without, softmax or sigmoid, and Phi-3.5-MoE's
    sparsemixer where the config names its epsilon (Mixtral's names one it uses only in
    training: its softmax comes first), and last Llama 4's sigmoid whose weights scale the
    experts' inputs ("sigmoid_on_input": `expert_input_weighted`)."""
    if experts is None:
        return ("softmax",)
    if experts.choice_bias:
        return ("sigmoid", "softmax_biased")
    jitter = hasattr(hf_config, "router_jitter_noise")
    plain = ("softmax", "sigmoid", "sparsemixer") if jitter else ("softmax", "sigmoid")
    return (*plain, "sigmoid_on_input")


# The names of the settings `candidates` varies, in the order of its product.
_CHOICES = ("rotary_on", "rotary_layout", "norm_topk", "router_scoring", "attn_gate",
            "qk_norm_after_rotary", "attn_scale", "qkv_layout", "attn_soft_cap")  # fmt: skip
