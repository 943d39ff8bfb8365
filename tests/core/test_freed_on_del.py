"""A model is freed when its last reference goes, with Python's cyclic collector off: no
module refers back to itself (`_variants`: a component's chosen steps live on a class of its
own), so `del model` returns its weights at once, as a `transformers` model does. And a
model so built still deep-copies, pickles whole, and rebuilds from its class."""

import copy
import gc
import io
import weakref

import pytest
import torch
from helpers.families import FAMILIES, family_model

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core import _variants
from hookedattn.core.components.attention import Attention
from hookedattn.core.mixer_config import MixerConfig
from hookedattn.testing import random_tokens, tiny_model

TOKENS = random_tokens(23, 2, 6, seed=0)
SMALL = dict(n_layers=2, d_model=16, n_ctx=16, d_vocab=23, d_mlp=24, dtype="float64", seed=0)


def moe() -> HookedTransformer:
    fields = dict(n_heads=4, d_head=4, num_experts=4, experts_per_token=2, gated_mlp=True,
                  act_fn="silu")  # fmt: skip
    return HookedTransformer(HookedTransformerConfig(**SMALL, **fields))


def hybrid() -> HookedTransformer:
    mixers = MixerConfig(layers=("mamba2", "attention"), d_conv=3, n_ssm_heads=4, d_ssm_head=4,
                         d_state=5, n_ssm_groups=2)  # fmt: skip
    fields = dict(n_heads=4, d_head=4, normalization_type="RMS", gated_mlp=True, act_fn="silu",
                  positional_embedding_type="rotary", mixers=mixers)  # fmt: skip
    return HookedTransformer(HookedTransformerConfig(**SMALL, **fields))


def tl_facade() -> HookedTransformer:
    from hookedattn_tl import HookedTransformer as TLHookedTransformer

    return TLHookedTransformer(HookedTransformerConfig(**SMALL, n_heads=4, d_head=4, act_fn="gelu"))


BUILDERS = {
    **{name: (lambda name=name: family_model(name)) for name in FAMILIES},
    "gpt2-like": lambda: tiny_model(n_layers=2, d_model=16, n_heads=2, d_head=8, d_vocab=23),
    "moe": moe,
    "hybrid": hybrid,
    "TransformerLens facade": tl_facade,
}


@pytest.fixture
def collector_off():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


@pytest.mark.parametrize("name", BUILDERS)
def test_del_frees_the_weights_at_once(name, collector_off):
    model = BUILDERS[name]()
    model(TOKENS)
    logits, cache = model.run_with_cache(TOKENS)
    model.generate(TOKENS[:, :3], max_new_tokens=2, do_sample=False, stop_at_eos=False)
    weights = [weakref.ref(p) for p in model.parameters()]
    del model, cache, logits  # the logits' autograd graph holds the weights too
    assert [w for w in weights if w() is not None] == []


def test_a_components_class_is_named_as_its_base():
    attn = tiny_model(n_layers=1, d_model=16, n_heads=2, d_head=8, d_vocab=23).blocks[0].attn
    assert type(attn).__name__ == "Attention" and isinstance(attn, Attention)
    assert _variants.variant_base(type(attn)) is Attention
    assert "write" not in vars(attn) and attn.write == attn._write_summed


def test_a_deep_copy_and_a_whole_pickle_run_as_the_model():
    model = family_model("llama")
    expected = model(TOKENS)
    torch.testing.assert_close(copy.deepcopy(model)(TOKENS), expected, rtol=0, atol=0)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(loaded(TOKENS), expected, rtol=0, atol=0)


def test_a_model_built_from_a_models_class_chooses_its_own_steps():
    # A chosen class called to build a module builds its base, which chooses afresh.
    alibi = tiny_model(n_layers=1, d_model=16, n_heads=2, d_head=8, d_vocab=23,
                       positional_embedding_type="alibi")  # fmt: skip
    plain_cfg = alibi.cfg.replace(positional_embedding_type="standard")
    plain = type(alibi.blocks[0].attn)(plain_cfg)
    assert plain.biased == plain._unbiased
