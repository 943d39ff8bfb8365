"""Bad input gets a clear error, and leaves no hook attached and every weight unchanged."""

import pytest
import torch

from hookedattn import HookedTransformer
from hookedattn.testing import tiny_model


@pytest.fixture
def model() -> HookedTransformer:
    return tiny_model(n_layers=1, n_heads=2, n_ctx=8, d_vocab=20, d_mlp=32, dtype=torch.float32)


@pytest.fixture(autouse=True)
def nothing_changes(model):
    before = {n: p.clone() for n, p in model.state_dict().items()}
    model.add_hook("hook_embed", lambda x, hook: None, is_permanent=True)  # a user's own hook
    yield
    assert [h.hook_point.name for h in model.attached_hooks()] == ["hook_embed"]
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed"


def test_token_id_at_d_vocab_is_named(model):
    with pytest.raises(ValueError, match="token id 20 is out of range.*0..19"):
        model.run_with_cache(torch.tensor([[1, 2, 20]]))


def test_negative_token_id_is_named(model):
    with pytest.raises(ValueError, match="token id -3"):
        model.run_with_hooks(
            torch.tensor([[1, -3, 2]]), fwd_hooks=[("hook_embed", lambda x, hook: None)]
        )


def test_float_tokens_are_a_type_error(model):
    with pytest.raises(TypeError, match="integer token ids.*start_at_layer"):
        model(torch.rand(1, 4))


def test_sequence_longer_than_n_ctx(model):
    with pytest.raises(ValueError, match="9 positions exceed the model's n_ctx=8"):
        model.run_with_cache(torch.zeros(1, 9, dtype=torch.long))


def test_three_dimensional_tokens(model):
    with pytest.raises(ValueError, match=r"\[batch pos\]"):
        model(torch.zeros(1, 2, 3, dtype=torch.long))


def test_strings_without_a_tokenizer(model):
    with pytest.raises(ValueError, match="no tokenizer"):
        model("The cat sat")


def test_unknown_cache_name(model):
    with pytest.raises(KeyError, match="did you mean"):
        model.run_with_cache(torch.tensor([[1, 2]]), names_filter="blocks.0.hook_resid_pos")


def test_hook_that_raises(model):
    def broken(x, hook):
        raise RuntimeError("inside a user's hook")

    with pytest.raises(RuntimeError, match="inside a user's hook"):
        model.run_with_hooks(torch.tensor([[1, 2]]), fwd_hooks=[(lambda n: "attn" in n, broken)])
