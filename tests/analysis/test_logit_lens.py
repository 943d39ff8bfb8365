"""The logit lens: each layer's stream through the final norm, its own scale recomputed."""

import pytest
import torch

from analysis import LogitLens, accumulated_resid, logit_lens
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import random_tiny_model, random_tokens


def _model(norm="LN", attn_only=False, dtype=torch.float64):
    # The lens reads a cache, whose run writes every layer out; the references here are
    # plain forwards, which then take the same arithmetic (fused kernels differ by
    # rounding that an unnormalised float32 stream grows beyond the tolerance).
    return random_tiny_model(
        n_layers=3, n_ctx=8, d_vocab=20, d_mlp=24, attn_only=attn_only, normalization_type=norm,
        dtype=dtype, use_fused_kernels=False,
    )  # fmt: skip


TOKENS = random_tokens(20, batch=2, pos=6, seed=2)


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
@pytest.mark.parametrize("norm", ("LN", "RMS", None))
@pytest.mark.parametrize("attn_only", (True, False))
def test_each_layer_is_read_as_if_the_model_stopped_there(norm, attn_only, dtype):
    model = _model(norm, attn_only, dtype)
    logits, cache = model.run_with_cache(TOKENS)
    lens = logit_lens(model, cache)
    assert lens.labels == ("L0_resid_pre", "L1_resid_pre", "L2_resid_pre", "final")
    tol = tolerance(dtype).as_kwargs()
    with torch.no_grad():
        for layer in range(3):
            stream = model(TOKENS, stop_at_layer=layer)
            expected = model.unembed(model.ln_final(stream))
            torch.testing.assert_close(lens[f"L{layer}_resid_pre"], expected, **tol)
    torch.testing.assert_close(lens["final"], logits, **tol)


def test_mid_block_streams_are_included_when_asked():
    model = _model("RMS")
    _, cache = model.run_with_cache(TOKENS)
    lens = logit_lens(model, cache, incl_mid=True)
    assert lens.labels[:3] == ("L0_resid_pre", "L0_resid_mid", "L1_resid_pre")
    with torch.no_grad():
        expected = model.unembed(model.ln_final(cache["resid_mid", 1]))
    torch.testing.assert_close(lens["L1_resid_mid"], expected, rtol=1e-12, atol=1e-12)


def test_the_final_layers_scale_would_give_other_logits_for_early_layers():
    """The peers' lens divides every stream by ln_final's cached scale; ours does not."""
    model = _model("LN")
    _, cache = model.run_with_cache(TOKENS)
    lens = logit_lens(model, cache)
    streams = accumulated_resid(model, cache).components
    ln = model.ln_final
    centred = streams - streams.mean(-1, keepdim=True)
    with torch.no_grad():
        final_scale = centred / cache["scale"] * ln.w + ln.b
        peers = final_scale @ model.W_U + model.b_U
    torch.testing.assert_close(peers[-1], lens.logits[-1])  # the same for the final stream
    assert not torch.allclose(peers[0], lens.logits[0], rtol=1e-3, atol=1e-3)


def test_top_tokens_and_the_table():
    model = _model("LN")
    _, cache = model.run_with_cache(TOKENS)
    lens = logit_lens(model, cache)
    assert isinstance(lens, LogitLens)
    top = lens.top_tokens(3)
    assert top.shape == (4, 2, 6, 3)
    assert torch.equal(top[..., 0], lens.logits.argmax(-1))

    class Letters:
        def decode(self, ids):
            return "".join(chr(ord("a") + i) for i in ids)

    table = lens.top(2, batch=1, pos=3, tokenizer=Letters())
    assert table.columns == ("stream", "1st", "2nd")
    assert table.column("stream") == lens.labels
    best = int(lens.logits[2, 1, 3].argmax())
    assert table.rows[2][1].startswith(repr(chr(ord("a") + best)))
    assert "4 points" in repr(lens)


def test_logprobs_of_given_tokens():
    model = _model("LN")
    _, cache = model.run_with_cache(TOKENS)
    lens = logit_lens(model, cache)
    targets = TOKENS.roll(-1, dims=1)
    logprobs = lens.logprobs(targets)
    assert logprobs.shape == (4, 2, 6)
    expected = lens.logits[1, 0, 4].log_softmax(-1)[targets[0, 4]]
    torch.testing.assert_close(logprobs[1, 0, 4], expected)
