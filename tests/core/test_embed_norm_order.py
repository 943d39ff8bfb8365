"""`embed_norm_before_positions` (BlenderbotSmall's order): the token embedding normed, then
the learned positions added, against the same sum written out with `F.layer_norm` in
float64; and the config refusing the flag without a norm of the embeddings."""

import pytest
import torch
import torch.nn.functional as F

from hookedattn import HookedTransformer, HookedTransformerConfig


def config(**changes) -> HookedTransformerConfig:
    fields = dict(n_layers=1, d_model=16, n_ctx=8, d_head=4, d_vocab=20, d_mlp=32,
                  normalization_type="LN", embed_norm=True, embed_norm_before_positions=True,
                  dtype=torch.float64, seed=0)  # fmt: skip
    return HookedTransformerConfig(**(fields | changes))


def test_the_token_embedding_is_normed_before_the_positions_are_added():
    model = HookedTransformer(config())
    with torch.no_grad():
        model.ln_embed.w.normal_(generator=torch.Generator().manual_seed(1))
        model.ln_embed.b.normal_(generator=torch.Generator().manual_seed(2))
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    _, cache = model.run_with_cache(tokens)
    normed = F.layer_norm(model.W_E[tokens], (16,), model.ln_embed.w, model.ln_embed.b,
                          eps=model.cfg.eps)  # fmt: skip
    expected = normed + model.W_pos[:5]
    assert torch.allclose(cache["blocks.0.hook_resid_pre"], expected, atol=1e-12)


def test_the_order_needs_a_norm_of_the_embeddings():
    with pytest.raises(ValueError, match="embed_norm_before_positions"):
        config(embed_norm=False)
