"""Padded batches: every real token gets exactly what it gets when its prompt runs alone.

The reference for every test is the same model run on one prompt at a time, unpadded.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hookedattn import ByteTokenizer
from hookedattn.core.names import pos_axis
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import tiny_model

TOL = tolerance(torch.float64).as_kwargs()
PAD = 7  # any id: padded positions are masked out


def make_model(**overrides):
    base = dict(
        n_heads=2, n_ctx=24, d_vocab=259, d_mlp=32, use_attn_result=True,
        use_split_qkv_input=True, use_hook_mlp_in=True,
    )  # fmt: skip
    return tiny_model(tokenizer=ByteTokenizer(), **{**base, **overrides})


VARIANTS = {
    "learned positions, LN, MLP": {},
    "rotary, RMS, attention only": dict(
        positional_embedding_type="rotary", normalization_type="RMS", attn_only=True,
        use_hook_mlp_in=False, use_split_qkv_input=False, use_attn_in=True,
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def plain_model():
    return make_model()


@pytest.fixture(scope="module", params=list(VARIANTS), ids=list(VARIANTS))
def model(request, plain_model):
    """The model of each variant; the first (no overrides) is `plain_model` itself."""
    overrides = VARIANTS[request.param]
    return make_model(**overrides) if overrides else plain_model


def pad_batch(prompts: list[list[int]], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and mask, padded by hand (independently of `to_tokens`)."""
    length = max(len(p) for p in prompts)
    tokens, mask = [], []
    for p in prompts:
        fill = length - len(p)
        if side == "left":
            tokens.append([PAD] * fill + p)
            mask.append([0] * fill + [1] * len(p))
        else:
            tokens.append(p + [PAD] * fill)
            mask.append([1] * len(p) + [0] * fill)
    return torch.tensor(tokens), torch.tensor(mask)


def real_slice(prompts: list[list[int]], row: int, side: str) -> slice:
    length = max(len(p) for p in prompts)
    n = len(prompts[row])
    start = length - n if side == "left" else 0
    return slice(start, start + n)


def assert_padded_equals_alone(model, prompts, side):
    tokens, mask = pad_batch(prompts, side)
    logits, cache = model.run_with_cache(tokens, attention_mask=mask)
    for row, prompt in enumerate(prompts):
        alone_logits, alone = model.run_with_cache(torch.tensor([prompt]))
        real = real_slice(prompts, row, side)
        torch.testing.assert_close(logits[row, real], alone_logits[0], **TOL)
        assert set(cache) == set(alone)
        for name in alone:
            axis = pos_axis(name)
            index = (row,) + (slice(None),) * (axis - 1) + (real,)
            if axis == 2:  # scores and patterns: the key axis is a position axis too
                index += (real,)
            torch.testing.assert_close(cache[name][index], alone[name][0], **TOL, msg=name)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_equals_each_prompt_alone(model, side):
    prompts = [[3, 1, 4, 1, 5, 9], [2, 6], [5, 3, 5, 8], [9]]
    assert_padded_equals_alone(model, prompts, side)


@settings(max_examples=15, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 258), min_size=1, max_size=7), min_size=1, max_size=4),
    side=st.sampled_from(["left", "right"]),
)
def test_property_padded_batch_equals_prompts_alone(model, prompts, side):
    assert_padded_equals_alone(model, prompts, side)


@pytest.mark.parametrize("side", ["left", "right"])
def test_no_real_token_attends_to_padding(plain_model, side):
    prompts = [[1, 2, 3, 4, 5], [6, 7]]
    tokens, mask = pad_batch(prompts, side)
    _, cache = plain_model.run_with_cache(
        tokens, attention_mask=mask, names_filter=lambda name: name.endswith("hook_pattern")
    )
    for layer in range(plain_model.cfg.n_layers):
        pattern = cache["pattern", layer][1]  # [head query_pos key_pos]
        real = mask[1].bool()
        assert torch.all(pattern[:, real][:, :, ~real] == 0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_ids_never_change_a_real_token(plain_model, side):
    prompts = [[1, 2, 3, 4, 5], [6, 7]]
    tokens, mask = pad_batch(prompts, side)
    other = tokens.masked_fill(mask == 0, 200)
    real = mask.bool()
    a = plain_model(tokens, attention_mask=mask)[real]
    b = plain_model(other, attention_mask=mask)[real]
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_left_padding_counts_positions_from_the_first_real_token(plain_model):
    tokens, mask = pad_batch([[1, 2, 3], [4]], "left")
    seen = {}

    def grab_pos_embed(x, hook):
        seen["pos"] = x

    plain_model.run_with_hooks(
        tokens, attention_mask=mask, fwd_hooks=[("hook_pos_embed", grab_pos_embed)]
    )
    torch.testing.assert_close(seen["pos"][1, 2], plain_model.W_pos[0], rtol=0, atol=0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_loss_of_a_padded_batch_counts_real_predictions_only(plain_model, side):
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8]]
    tokens, mask = pad_batch(prompts, side)
    per_token = plain_model(tokens, attention_mask=mask, return_type="loss", loss_per_token=True)
    alone = [
        plain_model(torch.tensor([p]), return_type="loss", loss_per_token=True)[0] for p in prompts
    ]
    for row in range(len(prompts)):
        real = real_slice(prompts, row, side)
        predictions = slice(real.start, real.stop - 1)
        torch.testing.assert_close(per_token[row, predictions], alone[row], **TOL)
    mean = plain_model(tokens, attention_mask=mask, return_type="loss")
    torch.testing.assert_close(mean, torch.cat(alone).mean(), **TOL)


def test_a_padded_batch_of_strings_equals_each_string_alone(plain_model):
    texts = ["hello there", "hi", "héllo"]
    logits = plain_model(texts)  # right-padded, with the mask derived from the strings
    for row, text in enumerate(texts):
        alone = plain_model(text)
        torch.testing.assert_close(logits[row, : alone.shape[1]], alone[0], **TOL)


def test_tokenize_gives_the_mask_that_forward_needs(plain_model):
    texts = ["hello there", "hi"]
    batch = plain_model.tokenize(texts, padding_side="left")
    logits = plain_model(batch.tokens, attention_mask=batch.attention_mask)
    alone = plain_model("hi")
    torch.testing.assert_close(logits[1, -alone.shape[1] :], alone[0], **TOL)


# ---------------------------------------------------------------- bad input
def test_mask_of_the_wrong_shape(plain_model):
    tokens = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 2\) but the tokens"):
        plain_model(tokens, attention_mask=torch.ones(1, 2, dtype=torch.long))


def test_all_padding_row(plain_model):
    tokens = torch.tensor([[1, 2], [3, 4]])
    mask = torch.tensor([[1, 1], [0, 0]])
    with pytest.raises(ValueError, match=r"rows \[1\] of the attention mask are all padding"):
        plain_model(tokens, attention_mask=mask)


def test_an_empty_string_in_a_batch_is_an_all_padding_row(plain_model):
    batch = plain_model.tokenize(["ab", ""], prepend_bos=False)
    assert batch.attention_mask.tolist() == [[1, 1], [0, 0]]
    with pytest.raises(ValueError, match=r"rows \[1\] of the attention mask are all padding"):
        plain_model(batch.tokens, attention_mask=batch.attention_mask)


@pytest.mark.parametrize(
    ("mask", "error", "message"),
    [
        (torch.tensor([[1.0, 1.0]]), TypeError, "integers or booleans"),
        (torch.tensor([[1, 2]]), ValueError, "only 0"),
    ],
)
def test_mask_values(plain_model, mask, error, message):
    with pytest.raises(error, match=message):
        plain_model(torch.tensor([[1, 2]]), attention_mask=mask)


def test_a_boolean_mask_works_like_an_integer_one(plain_model):
    tokens, mask = pad_batch([[1, 2, 3], [4]], "left")
    torch.testing.assert_close(
        plain_model(tokens, attention_mask=mask.bool()),
        plain_model(tokens, attention_mask=mask),
        rtol=0,
        atol=0,
    )
