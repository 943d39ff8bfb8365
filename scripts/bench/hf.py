"""The `transformers` column of `scripts/bench`: the same weights in HuggingFace GPT-2.

`GPT2LMHeadModel` stores each linear map as a `Conv1D` weight `[in out]` and fuses the
heads' q, k, v into one `c_attn`; this lays our per-head weights out that way (the inverse
of `hookedattn.core.hf`'s GPT-2 table), so that both run the same numbers. None where
`transformers` is not installed or the model is not GPT-2-shaped (learned positions,
LayerNorm, a plain MLP, no unembedding bias).
"""

from typing import Any

import torch
from einops import rearrange

from hookedattn import HookedTransformer

_ACT = {"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu"}


def hf_gpt2(model: HookedTransformer) -> Any:
    """A `transformers.GPT2LMHeadModel` with `model`'s weights, or None."""
    try:
        import transformers
    except ImportError:
        return None
    c = model.cfg
    shaped = (
        c.positional_embedding_type == "standard"
        and c.normalization_type == "LN"
        and not c.attn_only
        and c.act_fn in _ACT
        and c.n_heads * c.d_head == c.d_model
        and not bool(model.b_U.any())
    )
    if not shaped:
        return None
    config = transformers.GPT2Config(
        vocab_size=c.d_vocab, n_positions=c.n_ctx, n_embd=c.d_model, n_layer=c.n_layers,
        n_head=c.n_heads, n_inner=c.d_mlp, activation_function=_ACT[c.act_fn],
        layer_norm_epsilon=c.eps, tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=True, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    hf = transformers.GPT2LMHeadModel(config).to(c.dtype).eval()
    hf.load_state_dict(_gpt2_state_dict(model), strict=False)
    return hf.to(c.device)


def _gpt2_state_dict(model: HookedTransformer) -> dict[str, torch.Tensor]:
    sd = {
        "transformer.wte.weight": model.W_E,
        "transformer.wpe.weight": model.W_pos,
        "transformer.ln_f.weight": model.ln_final.w,
        "transformer.ln_f.bias": model.ln_final.b,
        "lm_head.weight": rearrange(model.W_U, "d_model d_vocab -> d_vocab d_model"),
    }
    for i, block in enumerate(model.blocks):
        attn, mlp, p = block.attn, block.mlp, f"transformer.h.{i}"
        qkv = [rearrange(w, "head d_model d_head -> d_model (head d_head)") for w in
               (attn.W_Q, attn.W_K, attn.W_V)]  # fmt: skip
        biases = [
            rearrange(b, "head d_head -> (head d_head)") for b in (attn.b_Q, attn.b_K, attn.b_V)
        ]
        sd |= {
            f"{p}.ln_1.weight": block.ln1.w,
            f"{p}.ln_1.bias": block.ln1.b,
            f"{p}.attn.c_attn.weight": torch.cat(qkv, dim=1),
            f"{p}.attn.c_attn.bias": torch.cat(biases),
            f"{p}.attn.c_proj.weight": rearrange(
                attn.W_O, "head d_head d_model -> (head d_head) d_model"
            ),
            f"{p}.attn.c_proj.bias": attn.b_O,
            f"{p}.ln_2.weight": block.ln2.w,
            f"{p}.ln_2.bias": block.ln2.b,
            f"{p}.mlp.c_fc.weight": mlp.W_in,
            f"{p}.mlp.c_fc.bias": mlp.b_in,
            f"{p}.mlp.c_proj.weight": mlp.W_out,
            f"{p}.mlp.c_proj.bias": mlp.b_out,
        }
    return {k: v.detach().contiguous() for k, v in sd.items()}


def hf_forward(hf: Any, tokens: torch.Tensor) -> Any:
    """Logits of one forward, without HF's own KV cache."""
    return lambda: hf(tokens, use_cache=False).logits


def hf_generate(hf: Any, tokens: torch.Tensor, n_new: int, use_cache: bool) -> Any:
    """Greedy decoding of `n_new` tokens by `transformers`' `generate`."""
    return lambda: hf.generate(
        tokens,
        attention_mask=torch.ones_like(tokens),
        max_new_tokens=n_new,
        min_new_tokens=n_new,
        do_sample=False,
        use_cache=use_cache,
        pad_token_id=0,
    )
