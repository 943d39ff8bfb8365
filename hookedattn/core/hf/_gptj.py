"""GPT-J (`GPTJForCausalLM`).

GPT-NeoX's parallel block (attention and MLP both read the stream; here through one shared
LayerNorm, `ln_1`, imported as both `ln1` and `ln2`), no attention biases, an MLP and an
unembedding with biases, and rotary positions on the first `rotary_dim` dimensions of each
head in GPT-J's own layout: pairs of neighbouring dimensions `(2i, 2i + 1)`, where ours (and
GPT-NeoX's) pairs `(i, i + rotary_dim / 2)`. A query-key dot product does not change when
the same permutation is applied to the dimensions of both, so the import permutes each
head's query and key dimensions (`(0, 2, 4, ..., 1, 3, 5, ...)` within the rotated ones):
the scores, pattern and everything after them are GPT-J's; `hook_q`, `hook_k` and
`W_Q`, `W_K` hold each head's rotated dimensions in that order (the unrotated ones, and
`hook_v` and `W_V`, as GPT-J's). GPT-J without `rotary_dim` is refused by name.
"""

from typing import Any

import torch
from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _translate
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._table import Rule, Table, zeros

_H = "transformer.h.{layer}"


def gptj_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.GPTJConfig`."""
    c = hf_config
    d_head = c.n_embd // c.n_head
    if not c.rotary_dim:
        raise ValueError("rotary_dim=None (GPT-J's rotation of whole heads) cannot be imported")
    return dict(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        n_ctx=c.n_positions,
        d_vocab=c.vocab_size,
        n_heads=c.n_head,
        d_head=d_head,
        d_mlp=c.n_inner or 4 * c.n_embd,
        act_fn=_translate.activation(c.activation_function, "activation_function"),
        normalization_type="LN",
        eps=c.layer_norm_epsilon,
        positional_embedding_type="rotary",
        rotary_dim=int(c.rotary_dim),
        rotary_base=10000.0,
        rotary_table_float32=True,  # its cosines and sines: a float32 table built once
        parallel_attn_mlp=True,
        attn_scale=d_head**0.5,
    )


def neighbours_to_halves(rotary_dim: int, d_head: int) -> Tensor:
    """The order that turns GPT-J's rotated pairs `(2i, 2i + 1)` into `(i, i + rot / 2)`."""
    rotated = torch.arange(rotary_dim)
    order = torch.cat([rotated[0::2], rotated[1::2]])
    return torch.cat([order, torch.arange(rotary_dim, d_head)])


def _permuted(cfg: HookedTransformerConfig):
    order = neighbours_to_halves(cfg.rotary_dim, cfg.d_head)

    def permute(W: Tensor) -> Tensor:  # [head d_model d_head]: each head's own dimensions
        return W[..., order.to(W.device)]

    return permute


def gptj_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """GPT-J: a parallel block with one LayerNorm, permuted query and key dimensions."""
    a, m, b = f"{_H}.attn", f"{_H}.mlp", "blocks.{layer}"
    heads_in = "(head d_head) d_model -> head d_model d_head"
    heads_out = "d_model (head d_head) -> head d_head d_model"
    permute = _permuted(cfg)
    rules = [
        Rule("embed.W_E", "transformer.wte.weight", "d_vocab d_model -> d_vocab d_model"),
        *(Rule(f"{b}.{ln}.{p}", f"{_H}.ln_1.{hf}", "d_model -> d_model")
          for ln in ("ln1", "ln2") for p, hf in (("w", "weight"), ("b", "bias"))),
        Rule(f"{b}.attn.W_Q", f"{a}.q_proj.weight", heads_in, adjust=permute),
        Rule(f"{b}.attn.W_K", f"{a}.k_proj.weight", heads_in, adjust=permute),
        Rule(f"{b}.attn.W_V", f"{a}.v_proj.weight", heads_in),
        Rule(f"{b}.attn.W_O", f"{a}.out_proj.weight", heads_out),
        *(zeros(f"{b}.attn.b_{x}", "head d_head") for x in "QKV"),
        zeros(f"{b}.attn.b_O", "d_model"),
        Rule(f"{b}.mlp.W_in", f"{m}.fc_in.weight", "d_mlp d_model -> d_model d_mlp"),
        Rule(f"{b}.mlp.b_in", f"{m}.fc_in.bias", "d_mlp -> d_mlp"),
        Rule(f"{b}.mlp.W_out", f"{m}.fc_out.weight", "d_model d_mlp -> d_mlp d_model"),
        Rule(f"{b}.mlp.b_out", f"{m}.fc_out.bias", "d_model -> d_model"),
        Rule("ln_final.w", "transformer.ln_f.weight", "d_model -> d_model"),
        Rule("ln_final.b", "transformer.ln_f.bias", "d_model -> d_model"),
        Rule("unembed.W_U", "lm_head.weight", "d_vocab_out d_model -> d_model d_vocab_out"),
        Rule("unembed.b_U", "lm_head.bias", "d_vocab_out -> d_vocab_out"),
    ]  # fmt: skip
    return Table(
        rules=tuple(r for rule in rules for r in rule.expand(cfg.n_layers)),
        ignored=(r"\.attn\.(bias|masked_bias)$",),
        label="GPT-J",
        base_prefix="transformer.",
    )


FAMILY = Family("GPTJForCausalLM", "gptj", gptj_fields, gptj_table)
