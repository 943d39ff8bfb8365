"""Streaming, stopping and seeded sampling: `generate_stream` joins to `generate`; rows end
at stop tokens, stop strings or their own `max_new_tokens`; a row's seeded samples do not
depend on the batch it is in."""

import pytest
import torch

from hookedattn import ByteTokenizer
from hookedattn.core.generation import RowSampler, Sampling, next_token_probs
from hookedattn.testing import tiny_model
from hookedattn_tl import HookedTransformer as TLHookedTransformer


def make_model(**overrides):
    base = dict(n_heads=2, n_ctx=48, d_vocab=259, d_mlp=32, init_range=0.5)
    return tiny_model(1, tokenizer=ByteTokenizer(), **{**base, **overrides})


@pytest.fixture(scope="module")
def model():
    return make_model()


PROMPTS = ["hello", "hi", "abc d"]


def greedy_reference(model, tokens, n_new):
    """The whole sequence through the forward at every step; argmax of the last position."""
    tokens = list(tokens)
    for _ in range(n_new):
        tokens.append(int(model(torch.tensor([tokens]))[0, -1].argmax()))
    return tokens


# ---------------------------------------------------------------- streaming
@pytest.mark.parametrize("per_yield", [1, 3, 25])
def test_streamed_token_chunks_join_to_what_generate_returns(model, per_yield):
    tokens = model.to_tokens(PROMPTS, padding_side="left")[:, -3:]  # unpadded ids
    chunks = list(model.generate_stream(tokens, 7, per_yield, stop_at_eos=False))
    assert torch.equal(torch.cat(chunks, dim=1), model.generate(tokens, 7, stop_at_eos=False))
    assert chunks[0].shape[1] == 3 + min(per_yield, 7)  # the prompt comes with the first chunk
    assert all(c.shape[1] <= per_yield for c in chunks[1:])


@pytest.mark.parametrize("per_yield", [1, 4])
def test_streamed_text_joins_to_what_generate_returns(model, per_yield):
    chunks = list(model.generate_stream("hello", 9, per_yield, stop_at_eos=False))
    assert "".join(chunks) == model.generate("hello", 9, stop_at_eos=False)
    assert len(chunks) > 1


def test_a_batch_of_texts_streams_one_text_per_row(model):
    chunks = list(model.generate_stream(PROMPTS, 6, 2, stop_at_eos=False))
    joined = ["".join(parts) for parts in zip(*chunks, strict=True)]
    assert joined == model.generate(PROMPTS, 6, stop_at_eos=False)


def test_a_stream_never_splits_a_character():
    # A byte model writing a two-byte character: each byte alone is not a character.
    model = make_model()
    e_acute = list("é".encode())
    with torch.no_grad():
        model.unembed.b_U[e_acute[0]] += 100  # after "x": the first byte, then the second
    bonus = torch.zeros(model.cfg.d_vocab, dtype=model.cfg.dtype)
    bonus[e_acute[1]] = 200.0

    def second_byte(logits, hook):  # after the first byte, the second one
        last = hook.ctx.setdefault("steps", [0])
        last[0] += 1
        return logits + bonus if last[0] % 2 == 0 else logits

    with model.hooks(fwd_hooks=[("unembed.hook_out", second_byte)]):
        chunks = list(model.generate_stream("x", 4, 1, stop_at_eos=False))
    assert all("\ufffd" not in c for c in chunks)
    assert "".join(chunks) == "x" + "é" * 2


def test_the_transformerlens_facade_streams_with_its_signature():
    model = make_model(model_class=TLHookedTransformer)
    tokens = model.to_tokens("hello")
    chunks = list(model.generate_stream(tokens, 5, 2, stop_at_eos=False, do_sample=False))
    assert torch.equal(torch.cat(chunks, dim=1), model.generate(tokens, 5, do_sample=False,
                                                                stop_at_eos=False))  # fmt: skip
    sampled = model.generate_stream(tokens, 3, verbose=False, seed=4, stop_at_eos=False)
    assert torch.cat(list(sampled), dim=1).shape == (1, 9)  # TL samples by default


# ---------------------------------------------------------------- stopping
def test_a_stop_string_ends_its_row_after_the_token_that_completes_it(model):
    free = model.generate("hello", 12, stop_at_eos=False)
    stop = free[len("hello") + 3 : len("hello") + 5]  # two characters it writes later
    out = model.generate("hello", 12, stop_strings=[stop], stop_at_eos=False)
    end = free.index(stop, len("hello")) + len(stop)
    assert out == free[:end]


def test_any_of_a_set_of_stop_tokens_ends_a_row(model):
    tokens = model.to_tokens(PROMPTS[0])
    free = greedy_reference(model, tokens[0].tolist(), 8)[tokens.shape[1] :]
    stops = [free[5], free[2], 7]  # the first one it reaches is free[2]
    out = model.generate(tokens, 8, eos_token_id=stops)
    assert out[0, tokens.shape[1] :].tolist() == free[:3]


def test_each_row_stops_after_its_own_max_new_tokens(model):
    batch = model.tokenize(PROMPTS, padding_side="left")
    out = model.generate(
        batch.tokens, [2, 5, 0], attention_mask=batch.attention_mask, stop_at_eos=False
    )
    assert out.shape[1] == batch.tokens.shape[1] + 5
    for row, (text, n) in enumerate(zip(PROMPTS, [2, 5, 0], strict=True)):
        alone = model.to_tokens(text)[0].tolist()
        new = out[row, batch.tokens.shape[1] :].tolist()
        assert new[:n] == greedy_reference(model, alone, n)[len(alone) :]
        assert new[n:] == [ByteTokenizer().padding_id()] * (5 - n)


def test_per_row_limits_must_match_the_rows(model):
    with pytest.raises(ValueError, match="max_new_tokens has 2 entries but there are 3 rows"):
        model.generate(PROMPTS, [1, 2], stop_at_eos=False)


def test_stop_strings_need_a_tokenizer():
    model = tiny_model()
    with pytest.raises(ValueError, match="stop_strings needs a tokenizer"):
        model.generate(torch.tensor([[1, 2]]), 2, stop_strings=["a"], stop_at_eos=False)


# ---------------------------------------------------------------- seeded sampling
def test_a_seeded_row_samples_the_same_tokens_whatever_its_batch(model):
    options = dict(do_sample=True, temperature=1.5, stop_at_eos=False)
    batch = model.generate(PROMPTS, 8, seed=[11, 12, 13], return_type="tokens", **options)
    width = batch.shape[1] - 8
    for row, (text, seed) in enumerate(zip(PROMPTS, [11, 12, 13], strict=True)):
        alone = model.generate(text, 8, seed=seed, return_type="tokens", **options)
        assert batch[row, -8:].tolist() == alone[0, -8:].tolist()
        assert batch[row, width - alone.shape[1] + 8 : width].tolist() == alone[0, :-8].tolist()
    again = model.generate(PROMPTS[:1], 8, seed=[11], return_type="tokens", **options)
    other = model.generate(PROMPTS[:1], 8, seed=[99], return_type="tokens", **options)
    assert torch.equal(again[0], batch[0, -again.shape[1] :])
    assert not torch.equal(other, again)


def test_seed_and_generator_are_not_given_together(model):
    with pytest.raises(ValueError, match="give seed= .* or generator=, not both"):
        model.generate("hi", 2, do_sample=True, seed=1, generator=torch.Generator())


def test_row_sampling_draws_from_the_sampling_distribution():
    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0, 0.5]], dtype=torch.float64)
    sampling = Sampling(True, temperature=0.8, top_k=4)
    sampler = RowSampler([5])
    draws = torch.stack([sampler.choose(logits, sampling) for _ in range(20000)])
    frequencies = torch.bincount(draws[:, 0], minlength=5).double() / len(draws)
    expected = next_token_probs(logits, sampling)[0]
    assert frequencies[3] == 0  # outside the top 4: never drawn
    torch.testing.assert_close(frequencies, expected, rtol=0, atol=0.015)
