"""The model against an independent, hook-free forward written with plain torch ops.

The reference (`hookedattn.testing.reference`) follows the seed worklog's recipe (one
`[d_model, n_heads * d_head]` matrix per projection, `view` + `transpose` to split heads,
concatenate, one output matrix), so it shares no code and no layout with the model; the
bench times the same reference.
"""

import pytest
import torch
import torch.nn.functional as F

from hookedattn import HookedTransformer, HookedTransformerConfig, LogitsAndLoss
from hookedattn.core.loss import lm_cross_entropy_loss
from hookedattn.testing import tiny_model
from hookedattn.testing.reference import reference_forward


def make_model(dtype=torch.float64, **overrides) -> HookedTransformer:
    fields = dict(
        n_layers=2, d_model=24, n_heads=3, d_head=8, n_ctx=16, d_vocab=37, d_mlp=48, seed=0
    )
    fields.update(overrides)
    model = HookedTransformer(HookedTransformerConfig(dtype=dtype, **fields))
    with torch.no_grad():  # non-trivial biases and norm weights, so that they are tested
        generator = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if not name.split(".")[-1].startswith("W_"):
                p.add_(0.1 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return model


VARIANTS = [
    {},
    {"attn_only": True},
    {"normalization_type": "RMS"},
    {"normalization_type": "LNPre", "act_fn": "relu"},
    {"normalization_type": "RMSPre", "act_fn": "silu"},
    {"normalization_type": None, "act_fn": "gelu_new"},
    {"positional_embedding_type": "rotary"},
    {"positional_embedding_type": "rotary", "rotary_dim": 4, "attn_only": True},
    {"positional_embedding_type": "none"},
    {"n_layers": 0},
    {"use_attn_result": True, "use_split_qkv_input": True, "use_hook_mlp_in": True},
    {"use_attn_in": True},
    {"d_head": 5, "n_heads": 2},
    {"d_vocab_out": 11},
    {"n_key_value_heads": 1, "positional_embedding_type": "rotary"},
    {"gated_mlp": True, "act_fn": "silu", "normalization_type": "RMS"},
    {"parallel_attn_mlp": True, "act_fn": "gelu"},
]


# Both execution paths: the fused kernels (a plain forward) and the written-out equations.
PATHS = {"fused": True, "written_out": False}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    "overrides", VARIANTS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default"
)
def test_forward_matches_independent_reference_float64(overrides, path):
    model = make_model(use_fused_kernels=PATHS[path], **overrides)
    tokens = torch.randint(0, 37, (3, 9), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(
        model(tokens), reference_forward(model, tokens), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("path", PATHS)
def test_forward_matches_reference_float32(path):
    model = make_model(dtype=torch.float32, use_fused_kernels=PATHS[path])
    tokens = torch.randint(0, 37, (3, 9), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(
        model(tokens), reference_forward(model, tokens), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_forward_runs_in_every_dtype(dtype):
    model = make_model(dtype=dtype)
    logits = model(torch.arange(9)[None])
    assert logits.dtype == dtype
    assert torch.isfinite(logits).all()


def test_forward_runs_under_shape_checks():
    model = tiny_model(
        d_model=32, d_vocab=50, use_split_qkv_input=True, use_attn_result=True,
        positional_embedding_type="rotary", dtype=torch.float32,
    )  # fmt: skip
    logits, _ = model.run_with_cache(torch.randint(0, 50, (2, 5)))
    assert logits.shape == (2, 5, 50)


def test_one_seed_gives_the_same_weights_in_float32_and_float64():
    w32 = make_model(dtype=torch.float32).W_Q
    w64 = make_model(dtype=torch.float64).W_Q
    assert torch.equal(w32.to(torch.float64), w64.to(torch.float32).to(torch.float64))


def test_seed_leaves_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    make_model()
    assert torch.equal(torch.rand(3), expected)


def test_cached_run_equals_plain_forward_bit_for_bit():
    # Bit for bit needs the written-out kernels: the plain forward would otherwise run
    # fused attention and norms where the cached run (hooks everywhere) cannot.
    model = make_model(dtype=torch.float32, use_attn_result=True, use_fused_kernels=False)
    tokens = torch.randint(0, 37, (2, 12))
    logits, _ = model.run_with_cache(tokens)
    assert torch.equal(logits, model(tokens))


def test_one_dimensional_tokens_are_a_batch_of_one():
    model = make_model()
    tokens = torch.randint(0, 37, (7,))
    assert torch.equal(model(tokens), model(tokens[None]))


def test_loss_is_mean_next_token_cross_entropy():
    model = make_model()
    tokens = torch.randint(0, 37, (2, 10))
    logits = model(tokens)
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, 37), tokens[:, 1:].reshape(-1))
    torch.testing.assert_close(model(tokens, return_type="loss"), expected)


def test_loss_per_token_has_one_loss_per_prediction():
    model = make_model()
    tokens = torch.randint(0, 37, (2, 10))
    per_token = model(tokens, return_type="loss", loss_per_token=True)
    assert per_token.shape == (2, 9)
    torch.testing.assert_close(per_token.mean(), model(tokens, return_type="loss"))


@pytest.mark.parametrize("mask", [None, torch.ones(2, 1, dtype=torch.long)])
def test_the_mean_loss_of_one_position_is_refused_with_or_without_a_mask(mask):
    logits, tokens = torch.randn(2, 1, 5), torch.tensor([[1], [2]])
    with pytest.raises(ValueError, match="needs at least 2 positions"):
        lm_cross_entropy_loss(logits, tokens, mask)
    per_token = lm_cross_entropy_loss(logits, tokens, mask, per_token=True)
    assert per_token.shape == (2, 0)


def test_a_model_loss_of_one_position_is_refused():
    model = tiny_model(n_layers=1, d_model=8, n_heads=2, n_ctx=8, d_vocab=10, d_mlp=8)
    with pytest.raises(ValueError, match="needs at least 2 positions"):
        model(torch.tensor([[3]]), return_type="loss")


def test_return_type_both_unpacks_as_logits_and_loss():
    model = make_model()
    tokens = torch.randint(0, 37, (2, 10))
    out = model(tokens, return_type="both")
    assert isinstance(out, LogitsAndLoss)
    logits, loss = out
    assert torch.equal(logits, model(tokens))
    assert torch.equal(loss, model(tokens, return_type="loss"))


def test_return_type_none_returns_none():
    assert make_model()(torch.arange(5), return_type=None) is None


def test_unknown_return_type_is_rejected():
    with pytest.raises(ValueError, match="'logit'"):
        make_model()(torch.arange(5), return_type="logit")


def test_stop_then_start_at_layer_equals_full_forward():
    model = make_model(n_layers=3)
    tokens = torch.randint(0, 37, (2, 8))
    resid = model(tokens, stop_at_layer=1)
    assert resid.shape == (2, 8, 24)
    torch.testing.assert_close(model(resid, start_at_layer=1), model(tokens), rtol=0, atol=0)


def test_stop_at_layer_returns_the_cached_resid_pre():
    model = make_model(n_layers=3, use_fused_kernels=False)
    tokens = torch.randint(0, 37, (2, 8))
    _, cache = model.run_with_cache(tokens)
    assert torch.equal(model(tokens, stop_at_layer=2), cache["resid_pre", 2])


@pytest.mark.parametrize(
    "bounds",
    [
        {"stop_at_layer": -1},
        {"start_at_layer": 4},
        {"stop_at_layer": True},
        {"start_at_layer": 2, "stop_at_layer": 1},
    ],
)
def test_layer_bounds_outside_0_to_n_layers_are_refused(bounds):
    # TransformerLens counts a negative stop_at_layer from the end; here it is an error,
    # as is a bound past n_layers (which would otherwise run nothing and return logits).
    with pytest.raises(ValueError, match="layer"):
        make_model(n_layers=3)(torch.randint(0, 37, (2, 8)), **bounds)


def test_start_at_layer_loss_needs_tokens():
    model = make_model()
    tokens = torch.randint(0, 37, (2, 8))
    resid = model(tokens, stop_at_layer=1)
    with pytest.raises(ValueError, match="tokens="):
        model(resid, start_at_layer=1, return_type="loss")
    loss = model(resid, start_at_layer=1, return_type="loss", tokens=tokens)
    torch.testing.assert_close(loss, model(tokens, return_type="loss"))


def test_start_at_layer_rejects_a_wrong_residual_shape():
    with pytest.raises(ValueError, match="d_model=24"):
        make_model()(torch.zeros(2, 8, 23, dtype=torch.float64), start_at_layer=1)


def test_zero_layer_model_is_embed_norm_unembed():
    model = make_model(n_layers=0)
    tokens = torch.randint(0, 37, (2, 5))
    _, cache = model.run_with_cache(tokens)
    assert list(cache) == [
        "hook_embed",
        "hook_pos_embed",
        "ln_final.hook_scale",
        "ln_final.hook_normalized",
        "ln_final.hook_out",
        "unembed.hook_in",
        "unembed.hook_out",
    ]


def test_stacked_weights_have_circuits_shapes():
    model = make_model()
    assert model.W_Q.shape == (2, 3, 24, 8)
    assert model.W_O.shape == (2, 3, 8, 24)
    assert model.b_Q.shape == (2, 3, 8)
    assert model.b_O.shape == (2, 24)
    assert model.W_in.shape == (2, 24, 48)
    assert model.W_out.shape == (2, 48, 24)
    assert model.W_E.shape == (37, 24)
    assert model.W_pos.shape == (16, 24)
    assert model.W_U.shape == (24, 37)
    assert torch.equal(model.W_K[1, 2], model.blocks[1].attn.W_K[2])


def test_stacked_mlp_weights_of_an_attention_only_model_are_an_error():
    with pytest.raises(ValueError, match="attention-only"):
        make_model(attn_only=True).W_in


def test_w_pos_of_a_rotary_model_is_an_error():
    with pytest.raises(ValueError, match="rotary"):
        make_model(positional_embedding_type="rotary").W_pos


def test_to_dtype_keeps_the_config_true():
    model = make_model(dtype=torch.float32, positional_embedding_type="rotary").to(torch.float64)
    assert model.cfg.dtype == torch.float64
    _, cache = model.run_with_cache(torch.arange(5))
    assert cache["blocks.0.attn.hook_rot_q"].dtype == torch.float64
    assert model(torch.arange(5)).dtype == torch.float64


def test_gradients_flow_to_every_parameter():
    model = make_model(use_attn_result=True)
    model(torch.randint(0, 37, (2, 8)), return_type="loss").backward()
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    assert unused == []


def test_weights_are_drawn_at_transformerlens_s_init_range():
    # TransformerLens 3.5.1 ("gpt2" init): every W_ is N(0, (0.8 / sqrt(d_model))^2), here
    # d_model 64 -> 0.1; 64 x 512 draws put the sample std within 1% of it by > 5 sigma.
    cfg = HookedTransformerConfig(
        n_layers=1, d_model=64, n_heads=4, n_ctx=8, d_vocab=512, d_mlp=128, seed=5
    )
    model = HookedTransformer(cfg)
    assert model.W_E.detach().std().item() == pytest.approx(0.1, rel=0.01)
    assert model.W_U.detach().std().item() == pytest.approx(0.1, rel=0.01)


def test_a_rotary_model_rotates_every_dimension_of_each_head_by_default():
    # TransformerLens: rotary_dim defaults to d_head. Past position 0 every dimension of a
    # query moves (a pair left unrotated would come out unchanged).
    model = make_model(positional_embedding_type="rotary", attn_only=True)
    _, cache = model.run_with_cache(torch.arange(6)[None])
    moved = (cache["rot_q", 0] - cache["q", 0])[:, 1:].abs().amax(dim=(0, 1, 2))
    assert bool((moved > 1e-6).all()), moved
