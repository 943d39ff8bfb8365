"""The forward's inputs: bad ones get a clear error that names them (and, for tokens, hooks
and cache names, leave no hook attached and every weight unchanged); layer bounds, token
dtypes and masks are checked; a long `n_ctx` costs nothing until a long input comes."""

from functools import partial

import pytest
import torch

from hookedattn import HookedTransformer
from hookedattn.testing import tiny_model


@pytest.fixture
def model() -> HookedTransformer:
    return tiny_model(n_layers=1, n_heads=2, n_ctx=8, d_vocab=20, d_mlp=32, dtype=torch.float32)


@pytest.fixture
def nothing_changes(model):
    before = {n: p.clone() for n, p in model.state_dict().items()}
    model.add_hook("hook_embed", lambda x, hook: None, is_permanent=True)  # a user's own hook
    yield
    assert [h.hook_point.name for h in model.attached_hooks()] == ["hook_embed"]
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed"


@pytest.mark.usefixtures("nothing_changes")
def test_token_id_at_d_vocab_is_named(model):
    with pytest.raises(ValueError, match="token id 20 is out of range.*0..19"):
        model.run_with_cache(torch.tensor([[1, 2, 20]]))


@pytest.mark.usefixtures("nothing_changes")
def test_negative_token_id_is_named(model):
    with pytest.raises(ValueError, match="token id -3"):
        model.run_with_hooks(
            torch.tensor([[1, -3, 2]]), fwd_hooks=[("hook_embed", lambda x, hook: None)]
        )


@pytest.mark.usefixtures("nothing_changes")
def test_float_tokens_are_a_type_error(model):
    with pytest.raises(TypeError, match="integer token ids.*start_at_layer"):
        model(torch.rand(1, 4))


@pytest.mark.usefixtures("nothing_changes")
def test_sequence_longer_than_n_ctx(model):
    with pytest.raises(ValueError, match="9 positions exceed the model's n_ctx=8"):
        model.run_with_cache(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.usefixtures("nothing_changes")
def test_three_dimensional_tokens(model):
    with pytest.raises(ValueError, match=r"\[batch pos\]"):
        model(torch.zeros(1, 2, 3, dtype=torch.long))


@pytest.mark.usefixtures("nothing_changes")
def test_strings_without_a_tokenizer(model):
    with pytest.raises(ValueError, match="no tokenizer"):
        model("The cat sat")


@pytest.mark.usefixtures("nothing_changes")
def test_unknown_cache_name(model):
    with pytest.raises(KeyError, match="did you mean"):
        model.run_with_cache(torch.tensor([[1, 2]]), names_filter="blocks.0.hook_resid_pos")


@pytest.mark.usefixtures("nothing_changes")
def test_hook_that_raises(model):
    def broken(x, hook):
        raise RuntimeError("inside a user's hook")

    with pytest.raises(RuntimeError, match="inside a user's hook"):
        model.run_with_hooks(torch.tensor([[1, 2]]), fwd_hooks=[(lambda n: "attn" in n, broken)])


# ------------------------------------------------ layer bounds, token dtypes, masks, n_ctx
make_model = partial(
    tiny_model, n_layers=2, d_model=16, n_heads=2, d_head=8, n_ctx=32, d_vocab=23, d_mlp=32
)
TOKENS = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "bounds",
    [
        {"stop_at_layer": 3},
        {"start_at_layer": -1},
        {"start_at_layer": True},
        {"stop_at_layer": 1.0},
    ],
)
def test_layer_bounds_are_ints_in_0_to_n_layers(bounds):
    model = make_model()
    with pytest.raises(ValueError, match=r"0\.\.2"):
        if "start_at_layer" in bounds:
            model(torch.zeros(2, 9, 16, dtype=torch.float64), **bounds)
        else:
            model(TOKENS, **bounds)


def test_tokens_given_with_start_at_layer_must_match_the_stream():
    model = make_model()
    resid = model(TOKENS, stop_at_layer=1)
    with pytest.raises(ValueError, match=r"tokens= has shape \(1, 3\)"):
        model(resid, start_at_layer=1, return_type="loss", tokens=TOKENS[:1, :3])


def test_out_of_vocabulary_tokens_with_start_at_layer_are_refused():
    model = make_model()
    resid = model(TOKENS, stop_at_layer=1)
    with pytest.raises(ValueError, match="out of range"):
        model(resid, start_at_layer=1, return_type="loss", tokens=TOKENS + 100)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
def test_narrow_integer_token_ids_give_the_int64_result(dtype):
    model = make_model()
    assert torch.equal(model(TOKENS.to(dtype)), model(TOKENS))


def test_meta_token_ids_are_refused():
    with pytest.raises(ValueError, match="meta"):
        make_model()(torch.empty(2, 3, dtype=torch.long, device="meta"))


def test_a_python_list_as_attention_mask_is_named():
    with pytest.raises(TypeError, match="attention_mask must be a tensor"):
        make_model()(TOKENS, attention_mask=[[1] * 9, [1] * 9])


def test_a_long_n_ctx_allocates_nothing_until_a_long_input_comes():
    # The causal mask is built per forward for the input's length, never n_ctx x n_ctx.
    model = make_model(n_ctx=10**6, positional_embedding_type="rotary")
    assert sum(b.numel() for b in model.buffers()) < 10_000
    assert model(TOKENS).shape == (2, 9, 23)
