"""MiniMax (`MiniMaxForCausalLM`, MiniMax-Text-01): a hybrid of lightning attention and
softmax attention layers (`layer_types`), each followed by a mixture of experts, in blocks
whose skips carry the normed stream (DeepNorm's scaled skips on pre-norms):

    x          = ln1(resid_pre)
    resid_mid  = alpha_attn * x + beta_attn * attn(x)        (attn: either kind)
    y          = ln2(resid_mid)
    resid_post = alpha_mlp * y + beta_mlp * moe(y)

our `NormedSkipBlock` (`normed_skip`, `attn_skip_scale = alpha_attn`, `mlp_skip_scale =
alpha_mlp`); each `beta` is folded into the weights of what it multiplies (`W_O`, the
lightning attention's `W_out`, the experts' `W_out`). The alphas are the config's
`full_attn_alpha_factor` or `linear_attn_alpha_factor` by layer type, and
`mlp_alpha_factor`: a checkpoint whose two attention alphas differ is refused (one
`attn_skip_scale` for every block). A `sliding_window` slides in every softmax attention
layer (`transformers` masks its "full_attention" layers with it).

The lightning attention layers (`self_attn` too, told apart by `layer_types`) are our
`LightningAttention`: `qkv_proj` holds each head's q, k, v in turn (`[head (q k v)
d_head]` rows), `output_gate` the gate, `norm` the RMSNorm over all heads (its epsilon
`transformers`' fixed default 1e-6), `out_proj`, and the buffer `slope_rate` each head's
decay (a function of the layer's index, read as the checkpoint keeps it). The softmax
attention and the experts are Mixtral's (softmax router, the chosen weights renormalised).

Written out, not derived by convention: the convention's wiring follows a layer's input
to its output as `resid + scale * write`, which a skip of the normed stream is not.
"""

import copy
from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _moe, _translate
from hookedattn.core.hf._deepseek import each_layer
from hookedattn.core.hf._family import Family, tied_unembedding
from hookedattn.core.hf._llama import L, llama_like_rules
from hookedattn.core.hf._table import Rule, Table, times, zeros
from hookedattn.core.mixer_config import MixerConfig

_KINDS = {"full_attention": "attention", "linear_attention": "lightning"}
_NORM_EPS = 1e-6  # MiniMaxLightningAttention's `norm`: MiniMaxRMSNorm's default epsilon
FILES = _moe.ExpertFiles(
    router="block_sparse_moe.gate.weight",
    gate="block_sparse_moe.experts.{expert}.w1.weight",
    up="block_sparse_moe.experts.{expert}.w3.weight",
    down="block_sparse_moe.experts.{expert}.w2.weight",
)


def minimax_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.MiniMaxConfig` (module docstring)."""
    c = hf_config
    types = list(c.layer_types[: c.num_hidden_layers])
    unknown = sorted(set(types) - set(_KINDS))
    if unknown:
        raise ValueError(f"layer_types holds {unknown}: MiniMax's kinds are {sorted(_KINDS)}")
    alphas = {float(c.full_attn_alpha_factor), float(c.linear_attn_alpha_factor)}
    if len(alphas) > 1:
        raise ValueError(
            f"full_attn_alpha_factor={c.full_attn_alpha_factor} differs from "
            f"linear_attn_alpha_factor={c.linear_attn_alpha_factor}: one attn_skip_scale "
            "serves every block"
        )
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    mixers = MixerConfig(
        layers=tuple(_KINDS[t] for t in types),
        n_ssm_heads=c.num_attention_heads,
        d_ssm_head=d_head,
        ssm_norm_eps=_NORM_EPS,
        lightning_decay_float32=True,  # its decay tables, built in float32 (`lightning`)
    )
    # `transformers` slides `sliding_window` (where set) in every softmax attention layer,
    # "full_attention" as `layer_types` calls them: read as a window in every block.
    windowed = copy.copy(c)
    windowed.layer_types = None
    return _translate.llama_like(windowed) | {
        **_moe.routing(c.num_local_experts, c.num_experts_per_tok, True),
        "mixers": mixers,
        "normed_skip": True,
        "attn_skip_scale": alphas.pop(),
        "mlp_skip_scale": float(c.mlp_alpha_factor),
    }


def _lightning_rules(beta: float) -> list[Rule]:
    """One lightning attention layer's rules (unexpanded), `beta` folded into `W_out`."""
    at, ours = f"{L}.self_attn", "blocks.{layer}.mixer"
    fused = "(ssm_head qkv d_ssm_head) d_model -> qkv d_model (ssm_head d_ssm_head)"
    return [
        *(Rule(f"{ours}.W_{n}", f"{at}.qkv_proj.weight", fused, pick=i)
          for i, n in enumerate("qkv")),
        Rule(f"{ours}.W_gate", f"{at}.output_gate.weight", "d_inner d_model -> d_model d_inner"),
        *(zeros(f"{ours}.b_{n}", "d_inner") for n in ("q", "k", "v", "gate")),
        Rule(f"{ours}.decay_rate", f"{at}.slope_rate",
             "ssm_head one at_batch -> (ssm_head one at_batch)"),
        Rule(f"{ours}.w_norm", f"{at}.norm.weight", "d_inner -> d_inner"),
        Rule(f"{ours}.W_out", f"{at}.out_proj.weight", "d_model d_inner -> d_inner d_model",
             adjust=times(beta)),
        zeros(f"{ours}.b_out", "d_model"),
    ]  # fmt: skip


def _scaled(rules: list[Rule], names: tuple[str, ...], factor: float) -> list[Rule]:
    """`rules`, those of our tensors ending in one of `names` multiplied by `factor`."""
    adjust = times(factor)
    return [Rule(**{**r.__dict__, "adjust": adjust})
            if adjust is not None and r.hf is not None and r.ours.endswith(names) else r
            for r in rules]  # fmt: skip


def minimax_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """MiniMax: Llama's attention and norms, the lightning attention layers, Mixtral's
    experts; each sublayer's beta folded into its output map."""
    c = hf_config
    kinds = [cfg.layer_mixer(i) for i in range(cfg.n_layers)]
    llama = llama_like_rules(cfg)
    shared = [r for r in llama if ".attn." not in r.ours and ".mlp." not in r.ours]
    attention = _scaled([r for r in llama if ".attn." in r.ours], ("W_O",),
                        float(c.full_attn_beta_factor))  # fmt: skip
    experts = _moe.expert_rules(cfg, FILES, live=hf_model is not None)
    rules = [
        *(r for rule in shared for r in rule.expand(cfg.n_layers)),
        *each_layer(attention, [i for i, k in enumerate(kinds) if k == "attention"]),
        *each_layer(_lightning_rules(float(c.linear_attn_beta_factor)),
                    [i for i, k in enumerate(kinds) if k == "lightning"]),
        *each_layer(_scaled(experts, ("W_out",), float(c.mlp_beta_factor)), range(cfg.n_layers)),
    ]  # fmt: skip
    return Table(
        rules=tuple(rules),
        aliases=tied_unembedding(c, "model.embed_tokens.weight"),
        ignored=(r"rotary_emb\.", r"self_attn\.(query_decay|key_decay|diagonal_decay)$"),
        label="MiniMax",
        base_prefix="model.",
    )


FAMILY = Family("MiniMaxForCausalLM", "minimax", minimax_fields, minimax_table)
