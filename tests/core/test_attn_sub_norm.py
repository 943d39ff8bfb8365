"""A norm of every head's `z` together before `W_O` reads it (`attn_sub_norm`, BitNet's
`attn_sub_norm`): one scale per position, shared by the heads. `hook_z` keeps the heads'
outputs before it, `hook_z_normed` what `W_O` reads. Checked in float64 against the norm
and the output map written out by hand; each head's write `zn_h @ W_O[h]` still sums to
the attention's output, and the residual decomposition to the stream."""

import pytest
import torch
from helpers.generation import greedy_with_and_without_cache

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.testing.identities import assert_residual_identities
from hookedattn.testing.models import randomize_parameters

EPS = 1e-5  # the config's default
BASE = dict(
    n_layers=2, d_model=16, n_heads=4, d_head=4, n_key_value_heads=2, n_ctx=16, d_vocab=23,
    d_mlp=8, gated_mlp=True, act_fn="silu", normalization_type="RMS",
    positional_embedding_type="rotary", attn_sub_norm=True, dtype="float64", seed=0,
)  # fmt: skip
TOKENS = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(3))


def _model(**overrides) -> HookedTransformer:
    cfg = HookedTransformerConfig(**{**BASE, **overrides})
    return randomize_parameters(HookedTransformer(cfg), scale=0.5, seed=1)


def test_attn_out_is_w_o_of_the_heads_z_normed_together() -> None:
    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    attn = model.blocks[1].attn
    z = cache["blocks.1.attn.hook_z"]  # [batch pos head d_head]
    rms = torch.sqrt(z.pow(2).mean(dim=(-2, -1), keepdim=True) + EPS)
    normed = attn.sub_norm.w * z / rms
    want = torch.einsum("bphd,hdm->bpm", normed, attn.W_O) + attn.b_O
    torch.testing.assert_close(cache["blocks.1.attn.hook_z_normed"], normed, rtol=0, atol=1e-12)
    torch.testing.assert_close(cache["blocks.1.hook_attn_out"], want, rtol=0, atol=1e-12)


def test_one_heads_z_moves_every_heads_normed_z() -> None:
    """The heads are coupled through the shared scale: what `hook_z` shows of one head is
    not what reaches `W_O` for the others unchanged."""
    model = _model()
    _, clean = model.run_with_cache(TOKENS)

    def double_head_0(z, hook):
        z[:, :, 0] = 2 * z[:, :, 0]
        return z

    with model.hooks(fwd_hooks=[("blocks.1.attn.hook_z", double_head_0)]):
        _, edited = model.run_with_cache(TOKENS)
    head_1 = (clean["blocks.1.attn.hook_z_normed"][:, :, 1],
              edited["blocks.1.attn.hook_z_normed"][:, :, 1])  # fmt: skip
    torch.testing.assert_close(
        edited["blocks.1.attn.hook_z"][:, :, 1], clean["blocks.1.attn.hook_z"][:, :, 1]
    )
    assert not torch.allclose(*head_1)


def test_head_writes_and_decomposition_sum() -> None:
    from analysis import decompose_resid
    from analysis.head_results import head_results

    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    results = head_results(model, cache, 1)
    attn_out = cache["blocks.1.hook_attn_out"]
    torch.testing.assert_close(results.sum(2) + model.blocks[1].attn.b_O, attn_out,
                               rtol=0, atol=1e-12)  # fmt: skip
    final = cache["blocks.1.hook_resid_post"]
    for granularity in ("sublayer", "head"):
        decomposition = decompose_resid(model, cache, granularity=granularity)
        torch.testing.assert_close(decomposition.components.sum(0), final, rtol=0, atol=1e-10)


def test_residual_identities_hold() -> None:
    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    assert_residual_identities(model, cache)


def test_generation_with_the_cache_is_generation_without() -> None:
    model = _model()
    assert torch.equal(*greedy_with_and_without_cache(model, TOKENS[:, :4]))


def test_sub_norm_needs_a_norm_kind() -> None:
    with pytest.raises(ValueError, match="attn_sub_norm=True holds a norm"):
        HookedTransformerConfig(**{**BASE, "normalization_type": None})


def test_process_weights_keeps_the_function_and_the_sub_norm() -> None:
    """Folding b_V into b_O would cross the norm: refused alone, skipped by process_weights
    (as fold_layer_norm is, which would drop the sub-norm's gain)."""
    from hookedattn.core.processing import fold_value_biases, process_weights

    model = _model()
    with pytest.raises(ValueError, match="attn_sub_norm"):
        fold_value_biases(model)
    processed = process_weights(model)
    logits, want = processed(TOKENS), model(TOKENS)
    centred = want - want.mean(-1, keepdim=True)  # center_unembed's constant per position
    torch.testing.assert_close(logits - logits.mean(-1, keepdim=True), centred, rtol=0, atol=1e-10)
