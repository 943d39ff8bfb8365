"""TL's run-time flag assignments on a facade model's config: `model.cfg.use_attn_result = True`.

Each assignment is held against the model's `set_*` method (TL's `set_use_attn_result` is
that assignment): the same hook points, the same parameters, logits equal to the model's
before. Other assignments stay refused, naming the flags that may be set.
"""

import copy
import dataclasses
import pickle

import pytest
import torch
from torch.testing import assert_close

from hookedattn.testing import random_tiny_model
from hookedattn_tl import HookedTransformer, HookedTransformerConfig

TOKENS = torch.tensor([[1, 5, 2, 7, 3, 3], [4, 4, 0, 6, 2, 1]])
# The same float64 sums, some split per head where they were not.
CLOSE = dict(rtol=0, atol=1e-12)
FLAGS = {
    "use_attn_result": "blocks.0.attn.hook_result",
    "use_split_qkv_input": "blocks.0.hook_q_input",
    "use_hook_mlp_in": "blocks.1.hook_mlp_in",
    "use_attn_in": "blocks.1.hook_attn_in",
}


def make_model(**changes) -> HookedTransformer:
    sizes = {**dict(n_heads=2, d_head=8, d_mlp=24, n_ctx=24, d_vocab=12), **changes}
    return random_tiny_model(model_class=HookedTransformer, **sizes).eval()


@pytest.mark.parametrize(("flag", "hook_name"), FLAGS.items())
def test_assigning_a_flag_is_its_set_method(flag, hook_name):
    assigned, set_by_method = make_model(), make_model()
    before = assigned(TOKENS)
    W_Q = assigned.blocks[0].attn.W_Q
    cfg = assigned.cfg
    setattr(assigned.cfg, flag, True)
    getattr(set_by_method, f"set_{flag}")(True)
    assert getattr(cfg, flag) and assigned.cfg is cfg  # the model's config, changed in place
    assert list(assigned.hook_dict) == list(set_by_method.hook_dict)
    assert assigned.cfg == set_by_method.cfg
    assert assigned.blocks[0].attn.W_Q is W_Q
    logits, cache = assigned.run_with_cache(TOKENS)
    assert hook_name in cache
    assert_close(logits, before, **CLOSE)
    setattr(assigned.cfg, flag, False)
    assert hook_name not in assigned.hook_dict and not getattr(cfg, flag)
    assert_close(assigned(TOKENS), before, **CLOSE)


def test_the_per_head_results_sum_to_the_attention_output():
    model = make_model()
    model.cfg.use_attn_result = True
    _, cache = model.run_with_cache(TOKENS)
    heads = cache["blocks.1.attn.hook_result"].sum(-2) + model.blocks[1].attn.b_O
    assert_close(heads, cache["blocks.1.hook_attn_out"], **CLOSE)


def test_hooks_stay_attached_across_an_assignment():
    model, seen = make_model(), []
    model.add_hook("blocks.0.hook_resid_post", lambda x, hook: seen.append(hook.name))
    model.cfg.use_split_qkv_input = True
    model(TOKENS)
    assert seen == ["blocks.0.hook_resid_post"]


def test_a_refused_value_leaves_the_model_as_it_was():
    model = make_model()
    model.cfg.use_split_qkv_input = True
    names = list(model.hook_dict)
    with pytest.raises(ValueError, match="use_attn_in and use_split_qkv_input"):
        model.cfg.use_attn_in = True
    assert not model.cfg.use_attn_in and list(model.hook_dict) == names
    attn_only = make_model(attn_only=True)  # held: a model no name holds is freed at once
    with pytest.raises(ValueError, match="use_hook_mlp_in=True needs MLPs"):
        attn_only.cfg.use_hook_mlp_in = True


def test_ungrouping_is_stored_without_grouping():
    model = make_model()
    names = list(model.hook_dict)
    model.cfg.ungroup_grouped_query_attention = True  # as in TL: changes nothing here
    assert model.cfg.ungroup_grouped_query_attention and list(model.hook_dict) == names


def grouped_model(**changes) -> HookedTransformer:
    return make_model(n_heads=4, d_head=4, n_key_value_heads=2, **changes)


def test_ungrouping_widens_the_key_and_value_hooks_to_every_query_head():
    model = grouped_model(use_split_qkv_input=True)
    before = model(TOKENS)
    model.cfg.ungroup_grouped_query_attention = True
    logits, cache = model.run_with_cache(TOKENS)
    for name in ("attn.hook_k", "attn.hook_v", "hook_k_input", "hook_v_input"):
        assert cache[f"blocks.0.{name}"].shape[2] == 4
    assert_close(logits, before, rtol=0, atol=1e-10)
    model.cfg.ungroup_grouped_query_attention = False
    assert model.run_with_cache(TOKENS)[1]["blocks.0.attn.hook_k"].shape[2] == 2


def test_an_ungrouped_key_hook_edits_one_query_head_alone():
    model = grouped_model()
    model.set_ungroup_grouped_query_attention(True)

    def zero_head_1(k, hook):
        k[:, :, 1] = 0.0
        return k

    _, clean = model.run_with_cache(TOKENS)
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_k", zero_head_1)]):
        _, edited = model.run_with_cache(TOKENS)
    pattern = clean["blocks.0.attn.hook_pattern"]
    edited_pattern = edited["blocks.0.attn.hook_pattern"]
    assert not torch.allclose(pattern[:, 1], edited_pattern[:, 1])
    assert_close(pattern[:, 0], edited_pattern[:, 0], **CLOSE)  # head 0 shares head 1's keys


def test_ungrouping_survives_another_flag_and_keeps_the_parameters():
    model = grouped_model()
    W_K = model.blocks[0].attn._W_K
    model.cfg.ungroup_grouped_query_attention = True
    model.cfg.use_attn_result = True
    _, cache = model.run_with_cache(TOKENS)
    assert cache["blocks.0.attn.hook_k"].shape[2] == 4 and model.blocks[0].attn._W_K is W_K
    assert model.W_K.shape == (2, 4, model.cfg.d_model, 4)  # still one per query head


def test_an_ungrouped_model_refuses_a_key_value_cache_naming_the_flag():
    model = HookedTransformer(grouped_model().cfg.replace(ungroup_grouped_query_attention=True))
    assert model.blocks[0].attn.group == 1  # built ungrouped
    with pytest.raises(ValueError, match="use_past_kv_cache=False"):
        model.generate(TOKENS[:1], max_new_tokens=2, stop_at_eos=False, verbose=False)
    out = model.generate(
        TOKENS[:1], max_new_tokens=2, stop_at_eos=False, use_past_kv_cache=False, verbose=False
    )
    assert out.shape == (1, TOKENS.shape[1] + 2)


def test_ungrouping_refuses_a_key_norm_over_all_heads():
    model = grouped_model(use_qk_norm=True, qk_norm_per_head=False)
    with pytest.raises(ValueError, match="qk_norm_per_head=False"):
        model.cfg.ungroup_grouped_query_attention = True


def test_other_assignments_name_the_flags():
    model = make_model()
    flags = "use_attn_result, use_split_qkv_input, use_hook_mlp_in, use_attn_in"
    with pytest.raises(dataclasses.FrozenInstanceError, match=flags) as error:
        model.cfg.n_layers = 3
    assert "cfg.replace(n_layers=3)" in str(error.value)
    with pytest.raises(dataclasses.FrozenInstanceError, match="does not support use_hook_tokens"):
        model.cfg.use_hook_tokens = True
    free = HookedTransformerConfig(n_layers=1, d_model=8, d_head=4, n_ctx=4, d_vocab=5)
    with pytest.raises(dataclasses.FrozenInstanceError, match="belongs to no model"):
        free.use_attn_result = True
    with pytest.raises(dataclasses.FrozenInstanceError, match="frozen"):
        free.n_layers = 2


def test_a_model_s_config_is_its_own():
    cfg = HookedTransformerConfig(
        n_layers=1, d_model=8, d_head=4, n_ctx=4, d_vocab=5, dtype=torch.float64
    )
    first, second = HookedTransformer(cfg), HookedTransformer(cfg)
    first.cfg.use_attn_result = True
    assert not cfg.use_attn_result and not second.cfg.use_attn_result
    assert first.cfg.bound_model is first and cfg.bound_model is None
    copied = copy.deepcopy(first)
    copied.cfg.use_attn_result = False
    assert first.cfg.use_attn_result and "blocks.0.attn.hook_result" in first.hook_dict
    assert "blocks.0.attn.hook_result" not in copied.hook_dict
    assert pickle.loads(pickle.dumps(first.cfg)) == first.cfg
    first.to(torch.float32)  # a new config, bound in turn
    first.cfg.use_attn_result = False
    assert "blocks.0.attn.hook_result" not in first.hook_dict
