"""OPT (`OPTForCausalLM`).

GPT-2's block in separate projections: learned positions, a LayerNorm before each sublayer
and at the end, biases on the query, key, value and output projections and on the MLP (ReLU
by default), the unembedding tied to the embedding. OPT's position table has two extra rows
at its start (`offset = 2`: position p is row p + 2), which are dropped; its positions count
real tokens, as ours do under padding. It scales the queries rather than the scores (the
same numbers; `hook_q` holds them unscaled). Variants the block cannot express are refused
by name: LayerNorm after the sublayers (`do_layer_norm_before=False`, OPT-350m), a
projection between the embedding and the stream (`word_embed_proj_dim != hidden_size`), no
final LayerNorm (`_remove_final_layer_norm`). Without `enable_bias` the biases are zeros;
without `layer_norm_elementwise_affine` the norms have no gain or bias (`LNPre`).
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _translate
from hookedattn.core.hf._family import Family, tied_unembedding
from hookedattn.core.hf._table import Rule, Table, zeros

_D = "model.decoder"
_L = f"{_D}.layers.{{layer}}"


def opt_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.OPTConfig`."""
    c = hf_config
    if not c.do_layer_norm_before:
        raise ValueError(
            "do_layer_norm_before=False (OPT-350m: LayerNorm after each sublayer, on the "
            "stream itself) cannot be imported"
        )
    if (c.word_embed_proj_dim or c.hidden_size) != c.hidden_size:
        raise ValueError(
            f"word_embed_proj_dim={c.word_embed_proj_dim} != hidden_size={c.hidden_size} "
            f"(project_in / project_out around the stream) cannot be imported"
        )
    if getattr(c, "_remove_final_layer_norm", False):
        raise ValueError("_remove_final_layer_norm=True (no final LayerNorm) cannot be imported")
    d_head = c.hidden_size // c.num_attention_heads
    return dict(
        n_layers=c.num_hidden_layers,
        d_model=c.hidden_size,
        n_ctx=c.max_position_embeddings,
        d_vocab=c.vocab_size,
        n_heads=c.num_attention_heads,
        d_head=d_head,
        d_mlp=c.ffn_dim,
        act_fn=_translate.activation(c.activation_function, "activation_function"),
        normalization_type="LN" if c.layer_norm_elementwise_affine else "LNPre",
        eps=1e-5,  # nn.LayerNorm's default, which OPT's layers use
        positional_embedding_type="standard",
        attn_scale=d_head**0.5,
    )


def opt_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """OPT: GPT-2's table in separate projections, the position table's offset dropped."""
    bias, affine = bool(hf_config.enable_bias), cfg.normalization_type == "LN"
    a, b = f"{_L}.self_attn", "blocks.{layer}"
    heads_in = "(head d_head) d_model -> head d_model d_head"
    heads_out = "d_model (head d_head) -> head d_head d_model"

    def maybe(ours: str, hf: str, pattern: str, present: bool, axes: str) -> Rule:
        return Rule(ours, hf, pattern) if present else zeros(ours, axes)

    norms = []
    if affine:
        for ours, hf in (("blocks.{layer}.ln1", f"{_L}.self_attn_layer_norm"),
                         ("blocks.{layer}.ln2", f"{_L}.final_layer_norm"),
                         ("ln_final", f"{_D}.final_layer_norm")):  # fmt: skip
            norms += [Rule(f"{ours}.w", f"{hf}.weight", "d_model -> d_model"),
                      Rule(f"{ours}.b", f"{hf}.bias", "d_model -> d_model")]  # fmt: skip
    rules = [
        Rule("embed.W_E", f"{_D}.embed_tokens.weight", "d_vocab d_model -> d_vocab d_model"),
        Rule("pos_embed.W_pos", f"{_D}.embed_positions.weight", "n_ctx d_model -> n_ctx d_model",
             split=("pos_offset", "n_ctx"), part=1),
        *norms,
        *(Rule(f"{b}.attn.W_{x}", f"{a}.{x.lower()}_proj.weight", heads_in) for x in "QKV"),
        *(maybe(f"{b}.attn.b_{x}", f"{a}.{x.lower()}_proj.bias", "(head d_head) -> head d_head",
                bias, "head d_head") for x in "QKV"),
        Rule(f"{b}.attn.W_O", f"{a}.out_proj.weight", heads_out),
        maybe(f"{b}.attn.b_O", f"{a}.out_proj.bias", "d_model -> d_model", bias, "d_model"),
        Rule(f"{b}.mlp.W_in", f"{_L}.fc1.weight", "d_mlp d_model -> d_model d_mlp"),
        maybe(f"{b}.mlp.b_in", f"{_L}.fc1.bias", "d_mlp -> d_mlp", bias, "d_mlp"),
        Rule(f"{b}.mlp.W_out", f"{_L}.fc2.weight", "d_model d_mlp -> d_mlp d_model"),
        maybe(f"{b}.mlp.b_out", f"{_L}.fc2.bias", "d_model -> d_model", bias, "d_model"),
        Rule("unembed.W_U", "lm_head.weight", "d_vocab_out d_model -> d_model d_vocab_out"),
        zeros("unembed.b_U", "d_vocab_out"),
    ]  # fmt: skip
    return Table(
        rules=tuple(r for rule in rules for r in rule.expand(cfg.n_layers)),
        aliases=tied_unembedding(hf_config, f"{_D}.embed_tokens.weight"),
        label="OPT",
        base_prefix="model.",
    )


FAMILY = Family("OPTForCausalLM", "opt", opt_fields, opt_table)
