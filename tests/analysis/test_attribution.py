"""Direct logit attribution: contributions + ln_final_bias + b_U sum to the actual logits."""

import itertools

import pytest
import torch

from analysis import LogitAttribution, apply_ln_to_stack, decompose_resid, direct_logit_attribution
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import random_tiny_model, random_tokens

VARIANTS = list(itertools.product(("LN", "RMS", None), (True, False), (True, False)))


def _model(norm="LN", attn_only=False, use_attn_result=False, dtype=torch.float64):
    return random_tiny_model(
        n_ctx=8, d_vocab=20, d_mlp=24, attn_only=attn_only, normalization_type=norm,
        use_attn_result=use_attn_result, dtype=dtype,
    )  # fmt: skip


TOKENS = random_tokens(20, batch=2, pos=6, seed=2)


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
@pytest.mark.parametrize(("norm", "attn_only", "use_attn_result"), VARIANTS)
def test_contributions_sum_to_the_actual_logits(norm, attn_only, use_attn_result, dtype):
    model = _model(norm, attn_only, use_attn_result, dtype)
    logits, cache = model.run_with_cache(TOKENS)
    targets = TOKENS.roll(-1, dims=1)
    expected = logits.gather(-1, targets[..., None])[..., 0]
    for granularity in ("sublayer", "head", "neuron"):
        decomp = decompose_resid(model, cache, granularity=granularity)
        attribution = direct_logit_attribution(model, cache, decomp, targets)
        torch.testing.assert_close(attribution.total(), expected, **tolerance(dtype).as_kwargs())


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
@pytest.mark.parametrize("norm", ("LN", "RMS", None))
def test_logit_differences_sum_to_the_actual_difference(norm, dtype):
    model = _model(norm, dtype=dtype)
    logits, cache = model.run_with_cache(TOKENS)
    decomp = decompose_resid(model, cache, granularity="neuron")
    attribution = direct_logit_attribution(model, cache, decomp, 3, torch.tensor([[7], [11]]))
    assert attribution.metric == "logit difference"
    expected = logits[..., 3] - torch.stack([logits[0, :, 7], logits[1, :, 11]])
    torch.testing.assert_close(attribution.total(), expected, **tolerance(dtype).as_kwargs())


def test_one_heads_contribution_and_the_bias_terms():
    model = _model("LN")
    _, cache = model.run_with_cache(TOKENS)
    attribution = direct_logit_attribution(
        model, cache, decompose_resid(model, cache, granularity="head"), 5
    )
    assert attribution.labels[-2:] == ("ln_final_bias", "b_U")
    ln, W_U, b_U = model.ln_final, model.W_U.detach(), model.b_U.detach()
    result = cache["z", 1][:, :, 2] @ model.blocks[1].attn.W_O[2].detach()
    normalised = (result - result.mean(-1, keepdim=True)) / cache["scale"] * ln.w.detach()
    torch.testing.assert_close(attribution["L1H2"], normalised @ W_U[:, 5], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        attribution["ln_final_bias"], (ln.b.detach() @ W_U[:, 5]).expand(2, 6)
    )
    assert torch.equal(attribution["b_U"], b_U[5].expand(2, 6))


def test_a_decomposition_already_through_ln_final_gives_the_same_attribution():
    model = _model("RMS")
    _, cache = model.run_with_cache(TOKENS)
    decomp = decompose_resid(model, cache, granularity="head")
    direct = direct_logit_attribution(model, cache, decomp, TOKENS)
    normalised = apply_ln_to_stack(model, cache, decomp)
    assert torch.equal(
        direct_logit_attribution(model, cache, normalised, TOKENS).contributions,
        direct.contributions,
    )
    assert "ln_final_bias" not in direct.labels  # RMSNorm has no bias


def test_only_the_final_stream_can_be_attributed_to_logits():
    model = _model("LN")
    _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(ValueError, match="final stream"):
        direct_logit_attribution(model, cache, decompose_resid(model, cache, 1), 0)
    with pytest.raises(ValueError, match=r"token ids in 0\.\.19"):
        direct_logit_attribution(model, cache, decompose_resid(model, cache), 20)
    with pytest.raises(ValueError, match="does not broadcast"):
        direct_logit_attribution(
            model, cache, decompose_resid(model, cache), torch.zeros(3, 3, dtype=torch.long)
        )


def test_top_and_table():
    model = _model("LN")
    _, cache = model.run_with_cache(TOKENS)
    attribution = direct_logit_attribution(
        model, cache, decompose_resid(model, cache, granularity="head"), 4
    )
    assert isinstance(attribution, LogitAttribution)
    top = attribution.top(4, batch=1, pos=2)
    values = attribution.contributions[:, 1, 2]
    best = int(values.abs().argmax())
    assert top.rows[0] == (attribution.labels[best], float(values[best]))
    assert [abs(v) for v in top.column("contribution")] == sorted(
        (abs(v) for v in top.column("contribution")), reverse=True
    )
    assert len(attribution.to_table()) == len(attribution)
    assert "logit" in repr(attribution) and "L0H0" in repr(attribution)
