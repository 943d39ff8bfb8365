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
    with pytest.raises(ValueError, match="use_hook_mlp_in=True needs MLPs"):
        make_model(attn_only=True).cfg.use_hook_mlp_in = True


def test_ungrouping_is_stored_without_grouping_and_refused_with_it():
    model = make_model()
    names = list(model.hook_dict)
    model.cfg.ungroup_grouped_query_attention = True  # as in TL: changes nothing here
    assert model.cfg.ungroup_grouped_query_attention and list(model.hook_dict) == names
    grouped = make_model(n_heads=4, d_head=4, n_key_value_heads=2)
    with pytest.raises(ValueError, match="kv_head=2 of n_heads=4"):
        grouped.cfg.ungroup_grouped_query_attention = True
    assert not grouped.cfg.ungroup_grouped_query_attention


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
