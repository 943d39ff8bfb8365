"""GPT-NeoX and Pythia (`GPTNeoXForCausalLM`).

Beyond GPT-2: attention and MLP in parallel (`use_parallel_residual`: both read the block's
input, `resid_post = resid_pre + attn(ln1(x)) + mlp(ln2(x))`), rotary positions on the
first `rotary_pct` of each head, an untied unembedding. `nn.Linear` stores `[out in]`, so
every weight is transposed. The fused `query_key_value` is laid out per head,
`[(head qkv d_head) d_model]` (head 0's q, k, v, then head 1's), unlike GPT-2's
`(qkv head d_head)`.
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _translate
from hookedattn.core.hf._family import Family, tied_unembedding
from hookedattn.core.hf._table import Rule, Table, zeros

_L = "gpt_neox.layers.{layer}"
_QKV_W = "(head qkv d_head) d_model -> qkv head d_model d_head"
_QKV_B = "(head qkv d_head) -> qkv head d_head"


def neox_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.GPTNeoXConfig`."""
    c = hf_config
    d_head = c.hidden_size // c.num_attention_heads
    return dict(
        n_layers=c.num_hidden_layers,
        d_model=c.hidden_size,
        n_ctx=c.max_position_embeddings,
        d_vocab=c.vocab_size,
        n_heads=c.num_attention_heads,
        d_head=d_head,
        d_mlp=c.intermediate_size,
        act_fn=_translate.activation(c.hidden_act),
        normalization_type="LN",
        eps=c.layer_norm_eps,
        parallel_attn_mlp=bool(c.use_parallel_residual),
        attn_scale=d_head**0.5,
        **_translate.rotary(c, d_head, partial=True),
    )


def neox_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """The GPT-NeoX conversion table."""
    b, a, m = "blocks.{layer}", f"{_L}.attention", f"{_L}.mlp"
    parts = tuple(enumerate("QKV"))
    if getattr(hf_config, "attention_bias", True):
        attn_biases = [
            *(Rule(f"{b}.attn.b_{p}", f"{a}.query_key_value.bias", _QKV_B, i) for i, p in parts),
            Rule(f"{b}.attn.b_O", f"{a}.dense.bias", "d_model -> d_model"),
        ]
    else:
        attn_biases = [
            *(zeros(f"{b}.attn.b_{p}", "head d_head") for _, p in parts),
            zeros(f"{b}.attn.b_O", "d_model"),
        ]
    rules = [
        Rule("embed.W_E", "gpt_neox.embed_in.weight", "d_vocab d_model -> d_vocab d_model"),
        Rule(f"{b}.ln1.w", f"{_L}.input_layernorm.weight", "d_model -> d_model"),
        Rule(f"{b}.ln1.b", f"{_L}.input_layernorm.bias", "d_model -> d_model"),
        *(Rule(f"{b}.attn.W_{p}", f"{a}.query_key_value.weight", _QKV_W, i) for i, p in parts),
        Rule(f"{b}.attn.W_O", f"{a}.dense.weight", "d_model (head d_head) -> head d_head d_model"),
        *attn_biases,
        Rule(f"{b}.ln2.w", f"{_L}.post_attention_layernorm.weight", "d_model -> d_model"),
        Rule(f"{b}.ln2.b", f"{_L}.post_attention_layernorm.bias", "d_model -> d_model"),
        Rule(f"{b}.mlp.W_in", f"{m}.dense_h_to_4h.weight", "d_mlp d_model -> d_model d_mlp"),
        Rule(f"{b}.mlp.b_in", f"{m}.dense_h_to_4h.bias", "d_mlp -> d_mlp"),
        Rule(f"{b}.mlp.W_out", f"{m}.dense_4h_to_h.weight", "d_model d_mlp -> d_mlp d_model"),
        Rule(f"{b}.mlp.b_out", f"{m}.dense_4h_to_h.bias", "d_model -> d_model"),
        Rule("ln_final.w", "gpt_neox.final_layer_norm.weight", "d_model -> d_model"),
        Rule("ln_final.b", "gpt_neox.final_layer_norm.bias", "d_model -> d_model"),
        Rule("unembed.W_U", "lm_head.weight", "d_vocab_out d_model -> d_model d_vocab_out"),
        zeros("unembed.b_U", "d_vocab_out"),
    ]
    # Pythia's files call the unembedding `embed_out`; transformers 5 renames it on load.
    aliases = {"lm_head.weight": ("embed_out.weight",)}
    for name, tied in tied_unembedding(hf_config, "gpt_neox.embed_in.weight").items():
        aliases[name] += tied
    return Table(
        rules=tuple(r for rule in rules for r in rule.expand(cfg.n_layers)),
        aliases=aliases,
        # Causal masks and rotary frequencies that older checkpoints saved.
        ignored=(r"\.attention\.(bias|masked_bias)$", r"rotary_emb\.inv_freq$"),
        label="GPT-NeoX",
        base_prefix="gpt_neox.",
    )


FAMILY = Family("GPTNeoXForCausalLM", "gpt_neox", neox_fields, neox_table)
