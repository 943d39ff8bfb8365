"""The porting surface of hookedattn_tl: the alias line and what TL 3.5 code calls beyond the
model (hook levels, the config, layers from the end, FactoredMatrix's TL errors, components,
direct path patching, in-place processing). Each is checked against an independent
reference here; tests/tl/test_tl_vs_transformer_lens.py holds the same against real TL.
"""

import dataclasses
import sys
import types

import pytest
import torch
from torch.testing import assert_close

import hookedattn_tl
from hookedattn_tl import HookedTransformer, HookedTransformerConfig

SIZES = dict(n_layers=3, d_model=16, d_head=4, n_heads=4, d_mlp=32, n_ctx=12, d_vocab=30)


def model_with_random_weights(seed: int = 0, **changes) -> HookedTransformer:
    cfg = HookedTransformerConfig(**{**SIZES, **changes}, dtype=torch.float64)
    model = HookedTransformer(cfg)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            parameter.copy_(noise * 0.3 + (1.0 if name.endswith(".w") else 0.0))
    return model.eval()


@pytest.fixture
def aliased():
    hookedattn_tl.install()
    yield
    hookedattn_tl.uninstall()


# ---------------------------------------------------------------- the alias line
def test_alias_resolves_submodules_to_the_same_objects(aliased):
    import transformer_lens
    import transformer_lens.utilities.cache as tl_cache
    from transformer_lens.tools.analysis.direct_path_patching import get_act_patch_direct_path

    assert transformer_lens is hookedattn_tl
    assert tl_cache is hookedattn_tl.utilities.cache
    assert get_act_patch_direct_path is (
        hookedattn_tl.tools.analysis.direct_path_patching.get_act_patch_direct_path
    )


def test_alias_names_a_path_the_facade_does_not_have(aliased):
    with pytest.raises(ModuleNotFoundError, match="transformer_lens.lit"):
        import transformer_lens.lit  # noqa: F401


def test_alias_refuses_to_shadow_a_real_transformer_lens():
    real = types.ModuleType("transformer_lens")
    real.__file__ = "/site-packages/transformer_lens/__init__.py"
    sys.modules["transformer_lens"] = real
    try:
        with pytest.raises(ImportError, match="/site-packages/transformer_lens"):
            hookedattn_tl.install()
    finally:
        del sys.modules["transformer_lens"]
    assert not any(type(f).__name__ == "_AliasFinder" for f in sys.meta_path)


def test_uninstall_removes_the_alias():
    hookedattn_tl.install()
    import transformer_lens.config

    hookedattn_tl.uninstall()
    assert not any(name.startswith("transformer_lens") for name in sys.modules)
    with pytest.raises(ModuleNotFoundError):
        import transformer_lens  # noqa: F401


# ---------------------------------------------------------------- hook levels
def test_nested_hooks_record_and_remove_their_own_level():
    model = model_with_random_weights()
    point = model.hook_dict["blocks.0.hook_resid_pre"]
    keep = lambda x, hook: None
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", keep)]):
        with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", keep)]):
            assert [h.context_level for h in point.fwd_hooks] == [1, 2]
            assert point.has_hooks(level=2) and not point.has_hooks(level=3)
        assert [h.context_level for h in point.fwd_hooks] == [1]
    assert not point.has_hooks()


def test_remove_hooks_at_a_level_keeps_the_others():
    point = hookedattn_tl.HookPoint()
    first, second = (lambda x, hook: None), (lambda x, hook: None)
    point.add_hook(first, level=1)
    point.add_hook(second, level=2)
    point.remove_hooks("fwd", level=1)
    assert [h.user_hook for h in point.fwd_hooks] == [second]


def test_hook_conversion_wraps_every_hook():
    class Doubling(hookedattn_tl.conversion_utils.BaseTensorConversion):
        def handle_conversion(self, x):
            return x * 2

        def revert(self, x):
            return x - 1

    point = hookedattn_tl.HookPoint()
    point.enable_reshape(Doubling())
    point.add_hook(lambda x, hook: x + 3)
    out = point(torch.tensor([1.0, 2.0]))
    assert_close(out, torch.tensor([1.0, 2.0]) * 2 + 3 - 1)


# ---------------------------------------------------------------- the config
def test_a_flag_assigned_on_a_config_of_no_model_names_the_model_s_config():
    cfg = HookedTransformerConfig(**SIZES)
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"model\.cfg\.use_attn_result"):
        cfg.use_attn_result = True


def test_tl_sentinels_and_descriptive_fields_are_read():
    cfg = HookedTransformerConfig(
        **SIZES, d_vocab_out=-1, attn_scale=-1.0, tokenizer_name="gpt2", checkpoint_index=3
    )
    assert cfg.d_vocab_out == SIZES["d_vocab"]
    assert cfg.attn_scale == SIZES["d_head"] ** 0.5
    assert (cfg.tokenizer_name, cfg.checkpoint_index) == ("gpt2", 3)


def test_a_field_we_do_not_compute_is_named():
    with pytest.raises(ValueError, match="use_attn_scale=False"):
        HookedTransformerConfig(**SIZES, use_attn_scale=False)


def test_n_params_counts_the_hidden_weights():
    model = model_with_random_weights()
    hidden = [
        p
        for name, p in model.named_parameters()
        if name.split(".")[-1] in ("W_Q", "W_K", "W_V", "W_O", "W_in", "W_out")
    ]
    assert model.cfg.n_params == sum(p.numel() for p in hidden)


def test_a_config_without_d_vocab_builds_no_model():
    cfg = hookedattn_tl.TransformerLensConfig(d_model=16, d_head=4, n_layers=1, n_ctx=8)
    with pytest.raises(ValueError, match="d_vocab"):
        HookedTransformer(cfg)


# ---------------------------------------------------------------- layers from the end
@pytest.mark.parametrize(
    "method",
    ["accumulated_resid", "decompose_resid", "stack_head_results", "get_full_resid_decomposition"],
)
def test_negative_layers_count_from_the_end(method):
    model = model_with_random_weights()
    _, cache = model.run_with_cache(torch.randint(0, 30, (2, 6)))
    n_layers = model.cfg.n_layers
    for layer in range(-n_layers - 1, 0):
        ours = getattr(cache, method)(layer, return_labels=True)
        positive = getattr(cache, method)(layer + n_layers + 1, return_labels=True)
        assert ours[1] == positive[1]
        assert_close(ours[0], positive[0], rtol=0, atol=0)


def test_a_layer_out_of_range_names_the_valid_ones():
    model = model_with_random_weights()
    _, cache = model.run_with_cache(torch.randint(0, 30, (1, 4)))
    with pytest.raises(ValueError, match=r"0\.\.3 .*-4\.\.-1"):
        cache.stack_head_results(-5)


# ---------------------------------------------------------------- FactoredMatrix
def test_factored_matrix_raises_tl_errors_that_are_also_ours():
    fm = hookedattn_tl.FactoredMatrix(torch.randn(3, 4), torch.randn(4, 5))
    with pytest.raises(AssertionError):
        fm @ torch.randn(6, 2)
    with pytest.raises(ValueError):
        fm @ torch.randn(6, 2)
    with pytest.raises(AssertionError):
        fm * torch.randn(2)
    with pytest.raises(RuntimeError, match="mismatch"):
        hookedattn_tl.FactoredMatrix(torch.randn(9, 5, 3), torch.randn(2, 4, 3, 7))


def test_factored_eigenvalues_are_those_of_b_times_a():
    A, B = torch.randn(5, 3, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    eigenvalues = hookedattn_tl.FactoredMatrix(A, B).eigenvalues
    expected = torch.linalg.eigvals(B @ A)
    assert_close(eigenvalues.abs().sort().values, expected.abs().sort().values)


def test_products_stay_tl_factored_matrices():
    model = model_with_random_weights()
    OV = model.OV[1, 2]
    assert type(OV) is hookedattn_tl.FactoredMatrix
    assert type(OV @ model.W_U) is hookedattn_tl.FactoredMatrix
    assert_close((OV @ model.W_U).AB, OV.AB @ model.W_U)


# ---------------------------------------------------------------- components
def test_attention_component_is_the_models_attention_sublayer():
    model = model_with_random_weights(attn_only=True, normalization_type=None)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    attention = hookedattn_tl.components.Attention(model.cfg)
    attention.load_state_dict(model.blocks[1].attn.state_dict(), strict=False)
    _, cache = model.run_with_cache(x, start_at_layer=1)
    assert_close(attention(x, x, x), cache["attn_out", 1])


def test_grouped_attention_equals_attention_with_repeated_keys_and_values():
    cfg = dict(n_layers=1, d_model=16, d_head=4, n_heads=4, n_ctx=8, n_key_value_heads=2)
    grouped = hookedattn_tl.components.GroupedQueryAttention(cfg)
    plain = hookedattn_tl.components.Attention({**cfg, "n_key_value_heads": None})
    weights = {n: p for n, p in grouped.named_parameters() if not n.startswith("_")}
    for name in ("W_K", "W_V", "b_K", "b_V"):
        weights[name] = getattr(grouped, name)  # repeated per query head
    plain.load_state_dict(weights, strict=False)
    x = torch.randn(2, 6, 16)
    assert_close(plain(x, x, x), grouped(x, x, x))


def test_mlp_component_computes_its_equation():
    mlp = hookedattn_tl.components.MLP(dict(SIZES, act_fn="gelu"))
    with torch.no_grad():
        mlp.b_in.normal_()
        mlp.b_out.normal_()
    x = torch.randn(2, 3, 16)
    expected = torch.nn.functional.gelu(x @ mlp.W_in + mlp.b_in) @ mlp.W_out + mlp.b_out
    assert_close(mlp(x), expected)


def test_solu_ln_normalises_after_the_activation():
    mlp = hookedattn_tl.components.MLP(dict(SIZES, act_fn="solu_ln"))
    x = torch.randn(1, 2, 16)
    pre = x @ mlp.W_in + mlp.b_in
    solu = pre * pre.softmax(-1)
    centred = solu - solu.mean(-1, keepdim=True)
    normed = centred / (centred.pow(2).mean(-1, keepdim=True) + mlp.cfg.eps).sqrt()
    assert_close(mlp(x), normed @ mlp.W_out + mlp.b_out)


def test_alibi_bias_is_each_heads_slope_times_the_distance():
    bias = hookedattn_tl.components.AbstractAttention.create_alibi_bias(4, 5)
    distance = torch.arange(5)[None, :] - torch.arange(5)[:, None]
    for h in range(4):
        slope = 2.0 ** (-8.0 * (h + 1) / 4)
        assert_close(bias[h], slope * distance.clamp(max=0).float())


# ---------------------------------------------------------------- direct paths, processing
def test_direct_path_into_a_value_is_the_linearised_patch():
    model = model_with_random_weights(normalization_type="LNPre")
    clean, corrupted = torch.randint(0, 30, (1, 6)), torch.randint(0, 30, (1, 6))
    _, clean_cache = model.run_with_cache(clean)
    _, corrupted_cache = model.run_with_cache(corrupted)
    metric = lambda logits: logits[0, -1, 0]
    from hookedattn_tl.tools.analysis import get_act_patch_direct_path

    result = get_act_patch_direct_path(
        model, corrupted, clean_cache, corrupted_cache, metric, 0, 1, "v"
    )
    # The reference: block 2's head 3 reads block 0's head 1 through its value input.
    W_O, W_V = model.blocks[0].attn.W_O[1], model.blocks[2].attn.W_V[3]
    delta = (clean_cache["z", 0][0, :, 1] - corrupted_cache["z", 0][0, :, 1]) @ W_O
    scale = corrupted_cache["blocks.2.ln1.hook_scale"][0]

    def patch(v, hook):
        v = v.clone()
        v[0, :, 3] += (delta / scale) @ W_V
        return v

    expected = metric(model.run_with_hooks(corrupted, fwd_hooks=[("blocks.2.attn.hook_v", patch)]))
    assert float(result[2, 3]) == pytest.approx(float(expected), rel=1e-6)
    assert not result[:1].any()


def test_process_weights_in_place_matches_the_processed_copy():
    from hookedattn.core.processing import process_weights

    model = model_with_random_weights()
    tokens = torch.randint(0, 30, (2, 5))
    copy = process_weights(model)
    same_object = model.process_weights_()
    assert same_object is model
    assert model.cfg.normalization_type == "LNPre"
    assert_close(model(tokens), copy(tokens))
