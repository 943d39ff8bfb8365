"""`ln1_layers`: blocks whose attention reads the residual stream without a pre-norm
(ModernBERT-decoder's first block, whose input is the embeddings' norm already), checked
against the queries computed from the weights by hand, float64."""

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.processing import center_writing_weights, fold_layer_norm
from hookedattn.testing.models import randomize_parameters

CFG = dict(n_layers=2, d_model=16, n_heads=4, d_head=4, n_ctx=12, d_vocab=23, d_mlp=32,
           act_fn="gelu", normalization_type="LN", embed_norm=True, dtype="float64",
           seed=0)  # fmt: skip
TOKENS = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(3))


def model(**overrides) -> HookedTransformer:
    cfg = HookedTransformerConfig(**{**CFG, "ln1_layers": (False, True), **overrides})
    return randomize_parameters(HookedTransformer(cfg), scale=0.5, seed=1)


def _queries(m: HookedTransformer, layer: int, x: torch.Tensor) -> torch.Tensor:
    attn = m.blocks[layer].attn
    return torch.einsum("bpd,hde->bphe", x, attn.W_Q) + attn.b_Q


def test_a_block_without_ln1_reads_the_stream_itself():
    m = model()
    with torch.no_grad():
        _, cache = m.run_with_cache(TOKENS)
    stream = cache["blocks.0.hook_resid_pre"]
    assert torch.allclose(cache["blocks.0.attn.hook_q"], _queries(m, 0, stream), atol=1e-13)
    x = cache["blocks.1.hook_resid_pre"]
    w, b = m.blocks[1].ln1.w, m.blocks[1].ln1.b
    centred = x - x.mean(-1, keepdim=True)
    normed = centred / (centred.pow(2).mean(-1, keepdim=True) + m.cfg.eps).sqrt() * w + b
    assert torch.allclose(cache["blocks.1.attn.hook_q"], _queries(m, 1, normed), atol=1e-12)


def test_a_block_without_ln1_has_no_norm_parameters():
    names = dict(model().named_parameters())
    assert "blocks.0.ln1.w" not in names and "blocks.1.ln1.w" in names


def test_folding_the_norms_keeps_the_logits_and_skips_the_missing_one():
    m = model(embed_norm=False)  # an embeddings' norm is refused by the fold itself
    folded = fold_layer_norm(m)
    with torch.no_grad():
        assert torch.allclose(folded(TOKENS), m(TOKENS), atol=1e-10)


def test_centring_the_writes_is_refused_where_a_block_reads_the_mean():
    with pytest.raises(ValueError, match=r"ln1_layers flag is off \(\[0\]\)"):
        center_writing_weights(model())


def test_ln1_layers_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="ln1_layers must be 2 booleans"):
        model(ln1_layers=(False,))
