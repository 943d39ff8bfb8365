"""`run_with_cache` and `ActivationCache`: names, shorthand, filters, slices and immutability;
and a cache holds its own forward's activations only, when a hook runs the model again."""

from functools import partial

import pytest
import torch

from hookedattn import ActivationCache
from hookedattn.testing import random_tiny_model, tiny_model

make_model = partial(
    tiny_model, n_layers=1, n_heads=2, n_ctx=12, d_vocab=20, d_mlp=32, dtype=torch.float32
)


TOKENS = torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]])

ATTN = [
    "blocks.0.attn.hook_q",
    "blocks.0.attn.hook_k",
    "blocks.0.attn.hook_v",
    "blocks.0.attn.hook_attn_scores",
    "blocks.0.attn.hook_pattern",
    "blocks.0.attn.hook_z",
]
LN1 = ["blocks.0.ln1.hook_scale", "blocks.0.ln1.hook_normalized", "blocks.0.ln1.hook_out"]
LN2 = ["blocks.0.ln2.hook_scale", "blocks.0.ln2.hook_normalized", "blocks.0.ln2.hook_out"]
LN_FINAL = [
    "ln_final.hook_scale",
    "ln_final.hook_normalized",
    "ln_final.hook_out",
    "unembed.hook_in",
    "unembed.hook_out",
]
MLP = ["blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post"]

EXPECTED_NAMES = {
    "default": (
        {},
        ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", *LN1, *ATTN,
         "blocks.0.hook_attn_out", "blocks.0.hook_resid_mid", *LN2, *MLP,
         "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post", *LN_FINAL],
    ),
    "attn_only": (
        {"attn_only": True},
        ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", *LN1, *ATTN,
         "blocks.0.hook_attn_out", "blocks.0.hook_resid_post", *LN_FINAL],
    ),
    "no_norm_no_pos": (
        {"normalization_type": None, "positional_embedding_type": "none", "attn_only": True},
        ["hook_embed", "blocks.0.hook_resid_pre", *ATTN, "blocks.0.hook_attn_out",
         "blocks.0.hook_resid_post", "unembed.hook_in", "unembed.hook_out"],
    ),
    "rotary_rms": (
        {"positional_embedding_type": "rotary", "normalization_type": "RMS", "attn_only": True},
        ["hook_embed", "blocks.0.hook_resid_pre", *LN1, *ATTN[:3], "blocks.0.attn.hook_rot_q",
         "blocks.0.attn.hook_rot_k", *ATTN[3:], "blocks.0.hook_attn_out",
         "blocks.0.hook_resid_post", *LN_FINAL],
    ),
    "every_flag": (
        {"use_attn_result": True, "use_attn_in": True, "use_hook_mlp_in": True},
        ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", "blocks.0.hook_attn_in",
         *LN1, *ATTN, "blocks.0.attn.hook_result", "blocks.0.hook_attn_out",
         "blocks.0.hook_resid_mid", "blocks.0.hook_mlp_in", *LN2, *MLP,
         "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post", *LN_FINAL],
    ),
    "split_qkv": (
        {"use_split_qkv_input": True, "attn_only": True},
        ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre", "blocks.0.hook_q_input",
         *LN1, "blocks.0.hook_k_input", "blocks.0.hook_v_input", *ATTN,
         "blocks.0.hook_attn_out", "blocks.0.hook_resid_post", *LN_FINAL],
    ),
}  # fmt: skip


@pytest.mark.parametrize("variant", EXPECTED_NAMES)
def test_cache_holds_exactly_these_names_in_forward_order(variant):
    overrides, expected = EXPECTED_NAMES[variant]
    _, cache = make_model(**overrides).run_with_cache(TOKENS)
    assert list(cache) == expected


def test_shapes_follow_the_axis_conventions():
    _, cache = make_model(use_attn_result=True).run_with_cache(TOKENS)
    assert cache["blocks.0.attn.hook_pattern"].shape == (2, 2, 5, 5)  # batch head query key
    assert cache["q", 0].shape == (2, 5, 2, 8)  # batch pos head d_head
    assert cache["result", 0].shape == (2, 5, 2, 16)  # batch pos head d_model
    assert cache["scale", 0, "ln1"].shape == (2, 5, 1)
    assert cache["pre", 0].shape == (2, 5, 32)


def test_shorthand_keys_return_the_same_tensor():
    model = make_model(n_layers=2)
    _, cache = model.run_with_cache(TOKENS)
    assert cache["pattern", 0] is cache["blocks.0.attn.hook_pattern"]
    assert cache["resid_pre", -1] is cache["blocks.1.hook_resid_pre"]
    assert cache["scale", 1, "ln2"] is cache["blocks.1.ln2.hook_scale"]
    assert cache["scale"] is cache["ln_final.hook_scale"]
    assert cache["embed"] is cache["hook_embed"]
    assert ("pattern", 1) in cache
    assert ("pattern", 2) not in cache


def test_attention_scores_are_scaled_and_masked():
    model = make_model()
    _, cache = model.run_with_cache(TOKENS)
    q, k = cache["q", 0], cache["k", 0]
    expected = torch.einsum("bqhd,bkhd->bhqk", q, k) / model.cfg.attn_scale
    scores = cache["attn_scores", 0]
    upper = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert torch.isneginf(scores[..., upper]).all()
    torch.testing.assert_close(scores[..., ~upper], expected[..., ~upper])
    torch.testing.assert_close(cache["pattern", 0], scores.softmax(-1))


def test_missing_key_names_the_closest_valid_ones():
    _, cache = make_model().run_with_cache(TOKENS)
    with pytest.raises(KeyError, match="blocks.0.attn.hook_pattern"):
        cache["blocks.0.attn.hook_patern"]
    with pytest.raises(KeyError, match="out of range"):
        cache["pattern", 3]
    with pytest.raises(ValueError, match="'ln1'"):
        cache["scale", 0]


def test_cache_is_read_only():
    _, cache = make_model().run_with_cache(TOKENS)
    with pytest.raises(TypeError, match="read-only"):
        cache["hook_embed"] = torch.zeros(1)
    with pytest.raises(TypeError, match="read-only"):
        del cache["hook_embed"]


def test_mapping_protocol():
    _, cache = make_model().run_with_cache(TOKENS)
    assert len(cache) == len(list(cache.keys())) == len(list(cache.values()))
    assert dict(cache.items())["hook_embed"] is cache["hook_embed"]
    assert "hook_embed" in cache
    assert "hook_nothing" not in cache


def test_repr_lists_names_shapes_dtype_and_size():
    _, cache = make_model().run_with_cache(TOKENS)
    text = repr(cache)
    assert text.startswith(f"ActivationCache: {len(cache)} activations")
    assert "float32 on cpu" in text
    assert "blocks.0.attn.hook_pattern" in text and "(2, 2, 5, 5)" in text
    assert "MB" in text


def test_names_filter_forms():
    model = make_model()
    _, by_name = model.run_with_cache(TOKENS, names_filter="blocks.0.attn.hook_pattern")
    _, by_list = model.run_with_cache(
        TOKENS, names_filter=["hook_embed", "blocks.0.hook_resid_post"]
    )
    _, by_pred = model.run_with_cache(TOKENS, names_filter=lambda n: n.endswith("scale"))
    assert list(by_name) == ["blocks.0.attn.hook_pattern"]
    assert list(by_list) == ["hook_embed", "blocks.0.hook_resid_post"]
    assert list(by_pred) == [
        "blocks.0.ln1.hook_scale",
        "blocks.0.ln2.hook_scale",
        "ln_final.hook_scale",
    ]


def test_names_filter_with_an_unknown_name_is_an_error():
    model = make_model()
    with pytest.raises(KeyError, match="hook_resid_post"):
        model.run_with_cache(TOKENS, names_filter=["blocks.0.hook_resid_psot"])
    assert model.attached_hooks() == []


def test_cache_leaves_no_hooks_attached():
    model = make_model()
    model.run_with_cache(TOKENS)
    assert model.attached_hooks() == []


def test_cached_tensors_are_detached():
    model = make_model()
    _, cache = model.run_with_cache(TOKENS)
    assert not any(t.requires_grad for t in cache.values())


def test_without_user_hooks_nothing_is_copied():
    model = make_model(n_layers=2)
    _, cache = model.run_with_cache(TOKENS)
    # resid_post of block 0 is the very tensor that enters block 1: stored once.
    assert cache["resid_post", 0].data_ptr() == cache["resid_pre", 1].data_ptr()


def test_cache_sees_what_flows_on_after_a_user_hook_edits_in_place():
    model = make_model()

    def zero_in_place(z, hook):
        z[:, :, 1] = 0

    model.add_hook("blocks.0.attn.hook_z", zero_in_place)
    _, cache = model.run_with_cache(TOKENS, names_filter="blocks.0.attn.hook_z")
    model.reset_hooks()
    assert (cache["z", 0][:, :, 1] == 0).all()


def test_a_later_in_place_edit_does_not_reach_the_cache():
    model = make_model()
    _, clean = model.run_with_cache(TOKENS, names_filter="blocks.0.attn.hook_z")
    stash = {}

    def keep(z, hook):
        stash["z"] = z

    def zero_earlier_activation(x, hook):
        stash["z"].mul_(0)  # an edit, at a later hook point, of a tensor already cached

    with model.hooks(
        fwd_hooks=[
            ("blocks.0.attn.hook_z", keep),
            ("blocks.0.hook_attn_out", zero_earlier_activation),
        ]
    ):
        _, cache = model.run_with_cache(TOKENS, names_filter="blocks.0.attn.hook_z")
    assert (stash["z"] == 0).all()
    assert torch.equal(cache["z", 0], clean["z", 0])


def test_pos_slice_keeps_positions_on_the_right_axis():
    model = make_model()
    _, full = model.run_with_cache(TOKENS)
    _, last = model.run_with_cache(TOKENS, pos_slice=-1)
    _, some = model.run_with_cache(TOKENS, pos_slice=[0, 2])
    _, window = model.run_with_cache(TOKENS, pos_slice=slice(1, 3))
    assert torch.equal(last["resid_pre", 0], full["resid_pre", 0][:, -1:])
    assert torch.equal(last["pattern", 0], full["pattern", 0][:, :, -1:])
    assert torch.equal(last["q", 0], full["q", 0][:, -1:])
    assert torch.equal(some["pattern", 0], full["pattern", 0][:, :, [0, 2]])
    assert torch.equal(window["scale", 0, "ln1"], full["scale", 0, "ln1"][:, 1:3])


def test_remove_batch_dim():
    model = make_model()
    _, cache = model.run_with_cache(TOKENS[:1], remove_batch_dim=True)
    assert cache["pattern", 0].shape == (2, 5, 5)
    assert not cache.has_batch_dim
    with pytest.raises(ValueError, match="batch of 1"):
        model.run_with_cache(TOKENS, remove_batch_dim=True)
    assert model.attached_hooks() == []


def test_cache_remove_batch_dim_returns_a_new_cache():
    _, cache = make_model().run_with_cache(TOKENS[:1])
    squeezed = cache.remove_batch_dim()
    assert squeezed["resid_pre", 0].shape == (5, 16)
    assert cache["resid_pre", 0].shape == (1, 5, 16)


def test_cache_dtype_and_device():
    model = make_model()
    _, cache = model.run_with_cache(TOKENS, dtype=torch.float16, device="cpu")
    assert all(t.dtype == torch.float16 for t in cache.values())
    moved = cache.to("cpu")
    assert isinstance(moved, ActivationCache) and list(moved) == list(cache)


def test_stack_across_layers():
    model = make_model(n_layers=3)
    _, cache = model.run_with_cache(TOKENS)
    stacked = cache.stack("pattern")
    assert stacked.shape == (3, 2, 2, 5, 5)
    assert torch.equal(stacked[2], cache["pattern", 2])
    assert torch.equal(cache.stack("scale", "ln2")[1], cache["scale", 1, "ln2"])


def test_incl_bwd_stores_gradients_of_the_loss():
    model = make_model()
    _, cache = model.run_with_cache(TOKENS, return_type="loss", incl_bwd=True)
    grad = cache["blocks.0.hook_resid_mid_grad"]
    assert grad.shape == cache["blocks.0.hook_resid_mid"].shape
    # Finite-difference check along the gradient direction.
    direction = grad / grad.norm()
    eps = 1e-3

    def loss_with(delta):
        return model.run_with_hooks(
            TOKENS,
            return_type="loss",
            fwd_hooks=[("blocks.0.hook_resid_mid", lambda x, hook: x + delta * direction)],
        )

    slope = (loss_with(eps) - loss_with(-eps)) / (2 * eps)
    torch.testing.assert_close(slope.detach(), grad.norm(), rtol=1e-2, atol=1e-4)
    assert all(p.grad is None for p in model.parameters())


def test_incl_bwd_needs_a_scalar_output():
    model = make_model()
    with pytest.raises(ValueError, match="scalar"):
        model.run_with_cache(TOKENS, incl_bwd=True)
    assert model.attached_hooks() == []


def test_nbytes_counts_shared_storage_once():
    model = make_model(n_layers=2)
    _, cache = model.run_with_cache(TOKENS)
    distinct = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in cache.values()
    }
    assert cache.nbytes() == sum(distinct.values())
    assert cache.nbytes() < sum(t.numel() * t.element_size() for t in cache.values())


# ------------------------------------------------------------ nested forwards
# A hook inside `run_with_cache` that runs the model again (a nested `run_with_cache`, or a
# plain forward on another prompt) once left the outer cache holding the inner prompt's
# activations at every point before the hook: two prompts' shapes in one cache.
POINT = "blocks.1.hook_resid_pre"


def model_and_prompts():
    model = random_tiny_model(dtype=torch.float64)
    outer = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(0))
    inner = torch.randint(0, model.cfg.d_vocab, (1, 3), generator=torch.Generator().manual_seed(1))
    return model, outer, inner


def assert_same_cache(got, expected):
    assert sorted(got.keys()) == sorted(expected.keys())
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_a_nested_run_with_cache_keeps_both_caches_apart():
    """Guards: the outer cache held the inner prompt's activations before the hook."""
    model, outer, inner = model_and_prompts()
    inner_caches = []

    def look_elsewhere(resid, hook):
        if not inner_caches:  # the inner forward passes this hook too: run it once
            inner_caches.append(None)
            inner_caches[0] = model.run_with_cache(inner)[1]

    with model.hooks([(POINT, look_elsewhere)]):
        logits, cache = model.run_with_cache(outer)
    clean_logits, clean_outer = model.run_with_cache(outer)
    _, clean_inner = model.run_with_cache(inner)
    assert torch.equal(logits, clean_logits)
    assert_same_cache(cache, clean_outer)
    assert_same_cache(inner_caches[0], clean_inner)


def test_a_plain_forward_inside_a_hook_leaves_the_cache_alone():
    """Guards: `model(other)` from a hook also wrote the other prompt into the cache."""
    model, outer, inner = model_and_prompts()

    ran = []

    def run_again(resid, hook):
        if not ran:
            ran.append(True)
            model(inner)

    with model.hooks([(POINT, run_again)]):
        _, cache = model.run_with_cache(outer, names_filter=lambda name: "resid" in name)
    _, clean = model.run_with_cache(outer, names_filter=lambda name: "resid" in name)
    assert_same_cache(cache, clean)
