"""TransformerLens idioms on our core API: the AttributeError names what to write here."""

import pytest
import torch
from torch import nn

import hookedattn
from hookedattn.core._tl_names import (
    CACHE,
    KEYWORDS,
    MODEL,
    TLNamesMixin,
    missing_attribute,
    unexpected_keywords,
)
from hookedattn.testing import tiny_model


@pytest.fixture(scope="module")
def core_cache() -> hookedattn.ActivationCache:
    fields = dict(n_layers=1, d_model=8, n_heads=2, n_ctx=8, d_vocab=10, attn_only=True)
    model = tiny_model(dtype=torch.float32, **fields)
    return model.run_with_cache(torch.tensor([[1, 2, 3]]))[1]


@pytest.mark.parametrize("name", sorted(CACHE))
def test_tl_cache_methods_name_their_replacement(core_cache, name):
    with pytest.raises(AttributeError, match="hookedattn_tl") as error:
        getattr(core_cache, name)
    assert CACHE[name] in str(error.value)


def test_decompose_resid_points_at_analysis(core_cache):
    with pytest.raises(AttributeError, match=r"analysis\.decompose_resid\(model, cache"):
        core_cache.decompose_resid()


def test_other_names_get_the_ordinary_message(core_cache):
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'$"):
        core_cache.no_such_thing
    assert hasattr(core_cache, "stack") and not hasattr(core_cache, "cache_dict")


def test_the_model_mixin_names_tl_model_methods():
    class HookedTransformer(TLNamesMixin, nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(2, 2)

    model = HookedTransformer()
    assert isinstance(model.layer, nn.Linear)  # nn.Module's lookup still works
    with pytest.raises(AttributeError, match="use_attn_result=True") as error:
        model.set_use_attn_result(True)
    assert "hookedattn_tl" in str(error.value)
    with pytest.raises(AttributeError, match="'HookedTransformer' object has no attribute 'x'$"):
        model.x
    assert all(missing_attribute("HookedTransformer", name).count(MODEL[name]) for name in MODEL)


def test_unexpected_tl_keywords_name_their_replacement():
    message = unexpected_keywords("run_with_cache", ["return_cache_object", "bogus"])
    assert "['bogus', 'return_cache_object']" in message
    assert KEYWORDS["return_cache_object"] in message and "hookedattn_tl" in message
    assert "TransformerLens" not in unexpected_keywords("forward", ["bogus"])
