"""Gemma 4's mixture of experts beside each block's dense MLP (`enable_moe_block`, the
26B-A4B model's; `moe_beside_mlp`, `router_expert_scale`) imports exactly.

Each twin (6 blocks, 4 experts 32 wide, 2 per token, the dense MLP 128 wide) is compared
with `transformers`: logits in float64 throughout and float32, greedy generation, each
sublayer's writes against `transformers`' norms' outputs, every residual identity, and each
piece (the mixture, the experts' own scales, the router's own norm) left out moving the
logits. The 26B-like twin has no per-layer inputs and its global blocks' keys serve as
their values. The unified models' config does not declare the field: a stray
`enable_moe_block` builds no mixture there, in `transformers` or here.
"""

import pytest
import torch
from helpers.float64_hf import InFloat64Throughout
from helpers.generation import greedy_ours_and_transformers, greedy_with_and_without_cache
from helpers.twins import assert_files_read_as_the_live_model, piece_output, relative_worst
from helpers.twins import tiny_twin as _tiny_twin

from hookedattn import HookedTransformer
from hookedattn.testing import assert_residual_identities, float64_throughout, published_constants

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 11], [9, 2, 2, 71, 30, 6, 5, 14, 100, 4]])
MOE = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)
# The 26B-A4B model's other pieces: no per-layer inputs, the global keys as values.
LARGE = dict(hidden_size_per_layer_input=0, attention_k_eq_v=True, num_global_key_value_heads=1)


@pytest.fixture(autouse=True)
def memo(tmp_path, monkeypatch):
    """A memo of the test's own: each test verifies afresh."""
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))


def mixture(model_type: str = "gemma4_text", seed: int = 0, **fields) -> torch.nn.Module:
    """The twin with the mixture, its routers' and experts' scales and block scalars drawn
    away from 1 (as built, all 1)."""
    fields = MOE | fields
    composite = model_type == "gemma4"  # its language model's config holds them
    model = _tiny_twin(model_type, seed=seed, **({"text_config": fields} if composite else fields))
    generator = torch.Generator().manual_seed(seed)
    draw = lambda t: t.copy_(0.5 + torch.rand(t.shape, generator=generator))
    with torch.no_grad():
        for layer in model.get_decoder().layers:
            draw(layer.layer_scalar)
            draw(layer.router.per_expert_scale)
            draw(layer.router.scale)
    return model


def test_the_mixture_is_read_as_ours():
    cfg = HookedTransformer.from_hf(mixture()).cfg
    assert cfg.moe_beside_mlp and cfg.router_expert_scale and cfg.norm_topk_prob
    assert (cfg.num_experts, cfg.experts_per_token, cfg.d_mlp, cfg.d_mlp_dense) == (4, 2, 32, 128)


@pytest.mark.parametrize("fields", [{}, LARGE], ids=["small", "large"])
def test_logits_are_transformers_in_float64_throughout(fields):
    reference = mixture(seed=1, **fields).double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = InFloat64Throughout(reference)(TOKENS).logits
        assert relative_worst(model(TOKENS), expected) <= 1e-10


@pytest.mark.parametrize("fields", [{}, LARGE], ids=["small", "large"])
def test_logits_are_transformers_in_float32(fields):
    reference = mixture(seed=2, **fields)
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        assert relative_worst(model(TOKENS), reference(TOKENS).logits) <= 1e-5


def test_greedy_generation_past_the_window_is_transformers():
    reference = mixture(seed=3, **LARGE)
    got, expected = greedy_ours_and_transformers(reference, TOKENS[:, :3], max_new_tokens=8)
    assert torch.equal(got, expected)
    cached, recomputed = greedy_with_and_without_cache(
        HookedTransformer.from_hf(reference), TOKENS[:, :3], max_new_tokens=8
    )
    assert torch.equal(cached, recomputed)


def test_each_write_is_what_transformers_norms():
    # The dense MLP's and the mixture's writes against HF's norms after each, block 2.
    reference = mixture(seed=4).double()
    model = HookedTransformer.from_hf(reference)
    _, cache = model.run_with_cache(TOKENS)
    with float64_throughout():
        for ours, hf in (("hook_dense_out", "post_feedforward_layernorm_1"),
                         ("hook_moe_out", "post_feedforward_layernorm_2")):  # fmt: skip
            expected = piece_output(reference, 2, hf, TOKENS).reshape(*TOKENS.shape, -1)
            assert relative_worst(cache[f"blocks.2.{ours}"], expected) <= 1e-12, ours


def test_every_residual_stream_identity_holds():
    # The router reading ln_router, the experts ln2_moe, the weights times each expert's
    # scale, and hook_mlp_out == ln2_post(hook_dense_out + hook_moe_out).
    model = HookedTransformer.from_hf(mixture(seed=5, **LARGE).double())
    _, cache = model.run_with_cache(TOKENS)
    c = model.cfg
    constants = published_constants(c.d_head, attn_scale=1.0, eps=c.eps, rotary_base=c.rotary_base)
    checked = assert_residual_identities(model, cache, constants=constants)
    assert any("hook_dense_out + blocks.5.hook_moe_out" in str(i) for i in checked.checked)


def _without(model: HookedTransformer, piece: str) -> HookedTransformer:
    """`model` with one of the mixture's pieces left out."""
    changed = model.copy()
    with torch.no_grad():
        for block in changed.blocks:
            if piece == "mixture":  # its write zero
                block.ln2_moe_post.w.zero_()
            elif piece == "expert_scales":
                block.mlp.w_expert_scale.fill_(1.0)
            else:  # the router reading the experts' input
                block.ln_router.w.copy_(block.ln2_moe.w)
    return changed


@pytest.mark.parametrize("piece", ["mixture", "expert_scales", "router_norm"])
def test_without_a_piece_the_import_would_differ(piece):
    reference = mixture(seed=6).double()
    changed = _without(HookedTransformer.from_hf(reference), piece)
    with torch.no_grad():
        assert relative_worst(changed(TOKENS), reference(TOKENS).logits) > 1e-3


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4"])
def test_a_saved_directory_loads_verified_like_the_live_model(tmp_path, model_type):
    reference = mixture(model_type, seed=7)
    reference.save_pretrained(tmp_path / "model")
    loaded = HookedTransformer.from_hf(tmp_path / "model")
    assert loaded.verification is not None and loaded.verification.worst <= 1e-10
    assert loaded.cfg.moe_beside_mlp
    assert_files_read_as_the_live_model(reference, tmp_path / "model")


def test_the_unified_models_build_no_mixture():
    reference = _tiny_twin("gemma4_unified_text", seed=8, **MOE).double()
    assert not hasattr(reference.model.layers[0], "router")
    model = HookedTransformer.from_hf(reference)
    assert not model.cfg.moe_beside_mlp and model.cfg.num_experts is None
    with torch.no_grad():
        expected = InFloat64Throughout(reference)(TOKENS).logits
        assert relative_worst(model(TOKENS), expected) <= 1e-10
