"""hookedattn_tl.patching: TransformerLens's functions and argument order, on our engine.

Every function is checked against TransformerLens's loop (one forward per patch,
`generic_activation_patch`), which is itself checked against a hand-written hook.
"""

import pytest
import torch
from torch.testing import assert_close

import hookedattn
from hookedattn.testing import tiny_model
from hookedattn_tl import HookedTransformer, patching, utils

N_LAYERS, N_HEADS, N_POS = 2, 2, 5


@pytest.fixture(scope="module")
def model() -> HookedTransformer:
    return tiny_model(
        model_class=HookedTransformer, n_layers=N_LAYERS, n_heads=N_HEADS, d_head=8, d_mlp=24,
        d_vocab=13, act_fn="gelu",
    )  # fmt: skip


@pytest.fixture(scope="module")
def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    clean = torch.randint(0, 13, (3, N_POS), generator=torch.Generator().manual_seed(0))
    corrupted = clean.clone()
    corrupted[:, 1] = (clean[:, 1] + 5) % 13
    return clean, corrupted


def metric(logits: torch.Tensor) -> torch.Tensor:
    """TL's kind of metric: one number for the whole batch."""
    return logits[:, -1, 3].mean() - logits[:, -1, 7].mean()


@pytest.fixture(scope="module")
def clean_cache(model, prompts):
    return model.run_with_cache(prompts[0])[1]


BATCHED = [
    ("get_act_patch_resid_pre", "resid_pre", patching.layer_pos_patch_setter, ("layer", "pos")),
    ("get_act_patch_resid_mid", "resid_mid", patching.layer_pos_patch_setter, ("layer", "pos")),
    ("get_act_patch_attn_out", "attn_out", patching.layer_pos_patch_setter, ("layer", "pos")),
    ("get_act_patch_mlp_out", "mlp_out", patching.layer_pos_patch_setter, ("layer", "pos")),
    *[
        (f"get_act_patch_attn_head_{name}_by_pos", kind,
         patching.layer_pos_head_vector_patch_setter, ("layer", "pos", "head"))
        for name, kind in (("out", "z"), ("q", "q"), ("k", "k"), ("v", "v"))
    ],
    *[
        (f"get_act_patch_attn_head_{name}_all_pos", kind,
         patching.layer_head_vector_patch_setter, ("layer", "head"))
        for name, kind in (("out", "z"), ("q", "q"), ("k", "k"), ("v", "v"))
    ],
    ("get_act_patch_attn_head_pattern_all_pos", "pattern",
     patching.layer_head_pattern_patch_setter, ("layer", "head_index")),
    ("get_act_patch_attn_head_pattern_by_pos", "pattern",
     patching.layer_head_pos_pattern_patch_setter, ("layer", "head_index", "dest_pos")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("function", "kind", "setter", "axes"), BATCHED, ids=[b[0] for b in BATCHED]
)
def test_batched_functions_give_tl_loop_numbers(
    model, prompts, clean_cache, function, kind, setter, axes
):
    batched = getattr(patching, function)(model, prompts[1], clean_cache, metric)
    loop = patching.generic_activation_patch(
        model, prompts[1], clean_cache, metric, setter, kind, axes
    )
    assert batched.shape == loop.shape
    assert_close(batched, loop, atol=1e-5, rtol=1e-5)


def test_tl_loop_matches_a_hand_written_patch(model, prompts, clean_cache):
    loop = patching.generic_activation_patch(
        model, prompts[1], clean_cache, metric, patching.layer_pos_patch_setter, "resid_pre",
        ("layer", "pos"),
    )  # fmt: skip

    def patch(resid, hook):
        resid = resid.clone()
        resid[:, 2] = clean_cache["resid_pre", 1][:, 2]
        return resid

    logits = model.run_with_hooks(
        prompts[1], fwd_hooks=[(utils.get_act_name("resid_pre", 1), patch)]
    )
    assert_close(loop[1, 2], metric(logits).float())


def test_resid_pre_recovers_the_clean_run_at_the_changed_position(model, prompts, clean_cache):
    result = patching.get_act_patch_resid_pre(model, prompts[1], clean_cache, metric)
    clean_value = metric(model(prompts[0])).float()
    corrupted_value = metric(model(prompts[1])).float()
    assert_close(result[0, 1], clean_value)
    assert_close(result[0, 0], corrupted_value)


def test_every_wrappers_stack_their_parts(model, prompts, clean_cache):
    block = patching.get_act_patch_block_every(model, prompts[1], clean_cache, metric)
    assert block.shape == (3, N_LAYERS, N_POS)
    attn_out = patching.get_act_patch_attn_out(model, prompts[1], clean_cache, metric)
    assert_close(block[1], attn_out)
    all_pos = patching.get_act_patch_attn_head_all_pos_every(model, prompts[1], clean_cache, metric)
    assert all_pos.shape == (5, N_LAYERS, N_HEADS)
    by_pos = patching.get_act_patch_attn_head_by_pos_every(model, prompts[1], clean_cache, metric)
    assert by_pos.shape == (5, N_LAYERS, N_POS, N_HEADS)
    pattern = patching.get_act_patch_attn_head_pattern_by_pos(
        model, prompts[1], clean_cache, metric
    )
    assert_close(by_pos[4], pattern.permute(0, 2, 1))


def test_dest_src_pattern_patching(model, prompts, clean_cache):
    result = patching.get_act_patch_attn_head_pattern_dest_src_pos(
        model, prompts[1], clean_cache, metric
    )
    assert result.shape == (N_LAYERS, N_HEADS, N_POS, N_POS)


def test_a_core_cache_runs_tl_s_loop(model, prompts):
    # A cache from the core model knows neither its model nor its tokens: the loop runs.
    core = hookedattn.HookedTransformer(model.cfg)
    core.load_state_dict(model.state_dict())
    _, core_cache = core.run_with_cache(prompts[0])
    from_core = patching.get_act_patch_attn_out(model, prompts[1], core_cache, metric)
    ours = patching.get_act_patch_attn_out(
        model, prompts[1], model.run_with_cache(prompts[0])[1], metric
    )
    assert_close(from_core, ours, atol=1e-5, rtol=1e-5)


def test_swapped_arguments_name_tl_s_order(model, prompts):
    with pytest.raises(TypeError, match="corrupted_tokens, clean_cache"):
        patching.get_act_patch_resid_pre(model, prompts[1], prompts[0], metric)


def test_grouped_query_attention_keys_and_values_per_key_value_head():
    fields = dict(d_mlp=24, d_vocab=13, n_key_value_heads=2, act_fn="gelu")
    gqa = tiny_model(model_class=HookedTransformer, **fields)
    clean = torch.randint(0, 13, (2, 4), generator=torch.Generator().manual_seed(1))
    corrupted = (clean + 1) % 13
    cache = gqa.run_with_cache(clean)[1]
    keys = patching.get_act_patch_attn_head_k_all_pos(gqa, corrupted, cache, metric)
    loop = patching.generic_activation_patch(
        gqa, corrupted, cache, metric, patching.layer_head_vector_patch_setter, "k",
        ("layer", "head"),
    )  # fmt: skip
    assert keys.shape == loop.shape == (2, 2)
    assert_close(keys, loop, atol=1e-5, rtol=1e-5)
    every = patching.get_act_patch_attn_head_all_pos_every(gqa, corrupted, cache, metric)
    assert every.shape == (5, 2, 4)
    # TL's layout: the key/value heads first, zeros for the rest.
    assert_close(every[2, :, :2], keys)
    assert bool((every[2, :, 2:] == 0).all())
