"""A norm of a gated MLP's neurons together before `W_out` reads them (`mlp_sub_norm`,
BitNet's `ffn_sub_norm`): `hook_mid` the neurons before it, `mlp.ln` the norm over `d_mlp`,
`hook_post` what `W_out` reads. Checked in float64 against the MLP written out by hand; each
neuron's write `post[n] * W_out[n]` still sums to the MLP's output and the residual
decomposition to the stream."""

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.testing.identities import assert_residual_identities
from hookedattn.testing.models import randomize_parameters

EPS = 1e-5  # the config's default
BASE = dict(
    n_layers=2, d_model=16, n_heads=4, d_head=4, n_ctx=16, d_vocab=23, d_mlp=12,
    gated_mlp=True, act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
    mlp_sub_norm=True, dtype="float64", seed=0,
)  # fmt: skip
TOKENS = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(4))


def _model(**overrides) -> HookedTransformer:
    cfg = HookedTransformerConfig(**{**BASE, **overrides})
    return randomize_parameters(HookedTransformer(cfg), scale=0.5, seed=2)


def test_mlp_out_is_w_out_of_the_neurons_normed_together() -> None:
    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    mlp = model.blocks[0].mlp
    x = cache["blocks.0.ln2.hook_out"]
    mid = torch.nn.functional.silu(x @ mlp.W_gate) * (x @ mlp.W_in + mlp.b_in)
    post = mlp.ln.w * mid / torch.sqrt(mid.pow(2).mean(-1, keepdim=True) + EPS)
    torch.testing.assert_close(cache["blocks.0.mlp.hook_mid"], mid, rtol=0, atol=1e-12)
    torch.testing.assert_close(cache["blocks.0.mlp.hook_post"], post, rtol=0, atol=1e-12)
    want = post @ mlp.W_out + mlp.b_out
    torch.testing.assert_close(cache["blocks.0.hook_mlp_out"], want, rtol=0, atol=1e-12)


def test_neuron_decomposition_sums() -> None:
    from analysis import decompose_resid

    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    final = cache["blocks.1.hook_resid_post"]
    decomposition = decompose_resid(model, cache, granularity="neuron")
    torch.testing.assert_close(decomposition.components.sum(0), final, rtol=0, atol=1e-10)


def test_residual_identities_hold() -> None:
    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    assert_residual_identities(model, cache)


def test_sub_norm_needs_a_gated_dense_mlp() -> None:
    with pytest.raises(ValueError, match="mlp_sub_norm norms a dense gated MLP"):
        HookedTransformerConfig(**{**BASE, "gated_mlp": False})
