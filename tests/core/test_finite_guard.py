"""The fused kernels' guard checked once per forward (nothing listening) against the guard
checked per layer (something listening): the same logits bit for bit on every block shape,
the same non-finite values, and one synchronisation past the input check.

The reference is the same forward with a no-op hook attached: the model is then listened
to, and every fused layer checks its own operands before the next runs.
"""

import pytest
import torch
from helpers.families import FAMILIES, family_model
from helpers.fused import VARIANTS, pair
from torch import nn
from torch.profiler import ProfilerActivity, profile

from hookedattn import HookedTransformer, HookedTransformerConfig, KeyValueCache
from hookedattn.testing import random_tokens

NO_OP = [("blocks.0.hook_resid_pre", lambda x, hook: None)]  # listened: a guard per layer


def models(dtype=torch.float64):
    out = {f"variant {k}": pair(v, dtype)[0] for k, v in VARIANTS.items()}
    out["variant llama written out"] = pair(VARIANTS["llama"], dtype)[1]
    return out | {f"family {k}": family_model(k, dtype=dtype) for k in FAMILIES}


MODELS = models()


def batch(model, padded, size=3, pos=7):
    tokens = random_tokens(model.cfg.d_vocab, size, pos, seed=3)
    if not padded:
        return tokens, None
    mask = torch.ones_like(tokens)
    mask[0, :2] = 0  # left padding
    mask[2, -3:] = 0  # right padding
    return tokens, mask


def checked_per_layer(model, *args, **kwargs):
    with model.hooks(fwd_hooks=NO_OP):
        return model(*args, **kwargs)


def assert_identical(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), (a - b).abs().max()
    assert torch.equal(a.isnan(), b.isnan())


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("name", MODELS)
def test_checked_once_gives_the_logits_checked_per_layer_bit_for_bit(name, padded):
    model = MODELS[name]
    tokens, mask = batch(model, padded)
    assert_identical(
        model(tokens, attention_mask=mask), checked_per_layer(model, tokens, attention_mask=mask)
    )


@pytest.mark.parametrize("name", ["variant gpt2", "variant llama", "family gemma2"])
def test_checked_once_in_float32_is_bit_for_bit(name):
    model = models(torch.float32)[name]
    tokens, _ = batch(model, False)
    assert_identical(model(tokens), checked_per_layer(model, tokens))


def test_checked_once_from_a_later_layer_and_its_loss():
    model = MODELS["family llama"]
    tokens, _ = batch(model, False)
    resid = model(tokens, stop_at_layer=1)
    once = model(resid, start_at_layer=1, tokens=tokens, return_type="both")
    per_layer = checked_per_layer(model, resid, start_at_layer=1, tokens=tokens, return_type="both")
    assert_identical(once.logits, per_layer.logits)
    assert_identical(once.loss, per_layer.loss)


def test_gradients_checked_once_are_the_gradients_checked_per_layer():
    model = MODELS["variant gpt2"].copy()
    tokens, _ = batch(model, False)
    grads = []
    for run in (model, lambda *a, **k: checked_per_layer(model, *a, **k)):
        model.zero_grad()
        run(tokens, return_type="loss").backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.equal(grads[0][name], grads[1][name]), name


def synchronisations(model, hooks=()):
    """`.item()` calls (host-device synchronisations) of one forward."""
    tokens, _ = batch(model, False)
    with torch.no_grad(), model.hooks(fwd_hooks=list(hooks)):
        model(tokens)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(tokens)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::item")


def test_a_forward_with_idle_hooks_synchronises_once_past_the_input_check():
    for n_layers in (2, 4):
        model = HookedTransformer(
            HookedTransformerConfig(
                n_layers=n_layers, d_model=16, n_heads=2, d_mlp=32, d_vocab=20, n_ctx=16, seed=0
            )
        )
        assert synchronisations(model) == 3  # the ids' range (low, high), and the one check
        assert synchronisations(model, NO_OP) >= 1 + n_layers  # the guard of every layer


# ---------------------------------------------------------------- torch hooks run once
def test_a_torch_forward_hook_on_a_submodule_runs():
    model = MODELS["variant gpt2"].copy()
    tokens, _ = batch(model, False)
    calls = []
    handle = model.blocks[1].mlp.register_forward_hook(lambda m, args, out: calls.append(1))
    model(tokens)
    handle.remove()
    model(tokens)
    assert calls == [1]


def test_a_global_module_hook_runs():
    model = MODELS["variant gpt2"]
    tokens, _ = batch(model, False)
    seen = []
    handle = nn.modules.module.register_module_forward_hook(
        lambda m, args, out: seen.append(type(m).__name__)
    )
    try:
        model(tokens)
    finally:
        handle.remove()
    assert "MLP" in seen and "Attention" in seen


class DoubledMLP(nn.Module):
    """A module of one's own in the MLP's place."""

    def __init__(self, mlp):
        super().__init__()
        self.inner = mlp

    def forward(self, x):
        return 2 * self.inner(x)


def test_a_module_assigned_after_a_forward_is_used():
    model = MODELS["variant gpt2"].copy()
    tokens, _ = batch(model, False)
    before = model(tokens)
    model.blocks[0].mlp = DoubledMLP(model.blocks[0].mlp)
    model.setup()
    after = model(tokens)
    assert not torch.allclose(before, after)
    assert_identical(after, checked_per_layer(model, tokens))


def test_weights_edited_between_forwards_are_read():
    model = MODELS["family llama"].copy()
    tokens, _ = batch(model, False)
    model(tokens)
    with torch.no_grad():
        model.blocks[0].attn.W_Q.mul_(1.5)  # in place
        model.unembed.W_U = nn.Parameter(model.unembed.W_U * 0.5)  # replaced
    assert_identical(model(tokens), checked_per_layer(model, tokens))


# ---------------------------------------------------------------- non-finite values
def poisoned(model, where):
    """A copy of `model` with a NaN or inf at `where`."""
    model = model.copy()
    with torch.no_grad():
        if where == "W_Q":  # a fused kernel may return 0 for a NaN query
            model.blocks[1].attn.W_Q[0, 0, 0] = float("nan")
        elif where == "W_K":
            model.blocks[0].attn.W_K[1, 2, 0] = float("inf")
        elif where == "W_V":
            model.blocks[0].attn.W_V[1, 3, 0] = float("nan")
        elif where == "W_U":
            model.unembed.W_U[2, 5] = float("nan")
        elif where == "embedding":  # one token's embedding: only the positions after it
            model.embed.W_E[4] = float("nan")
    return model


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("where", ["W_Q", "W_K", "W_V", "W_U", "embedding"])
def test_a_non_finite_weight_gives_the_logits_checked_per_layer(where, padded):
    model = poisoned(MODELS["variant gpt2"], where)
    tokens, mask = batch(model, padded)
    tokens[tokens == 4] = 5
    tokens[1, 4] = 4
    assert_identical(
        model(tokens, attention_mask=mask), checked_per_layer(model, tokens, attention_mask=mask)
    )


def test_a_nan_at_a_padded_position_reaches_no_real_token():
    model = poisoned(MODELS["family llama"], "embedding")
    tokens, mask = batch(model, True)
    tokens[tokens == 4] = 5
    tokens[0, 0] = 4  # padding
    logits = model(tokens, attention_mask=mask)
    assert logits[mask.bool()].isfinite().all()
    assert_identical(logits, checked_per_layer(model, tokens, attention_mask=mask))


# ---------------------------------------------------------------- a KV cache, stop_at_layer
def test_checked_once_stops_at_a_layer_bit_for_bit():
    model = MODELS["variant neox"]
    tokens, mask = batch(model, True)
    for stop in (1, model.cfg.n_layers):
        once = model(tokens, attention_mask=mask, stop_at_layer=stop)
        assert_identical(
            once, checked_per_layer(model, tokens, attention_mask=mask, stop_at_layer=stop)
        )


@pytest.mark.parametrize("name", ["variant gpt2", "family llama", "variant mistral-window"])
def test_checked_once_extends_a_kv_cache_as_checked_per_layer(name):
    model = MODELS[name]
    tokens, mask = batch(model, True, pos=9)
    caches, logits = [], []
    for run in (model, lambda *a, **k: checked_per_layer(model, *a, **k)):
        cache = KeyValueCache.empty(model.cfg, tokens.shape[0])
        first = run(tokens[:, :5], attention_mask=mask[:, :5], past_kv_cache=cache)
        second = run(tokens[:, 5:], attention_mask=mask[:, 5:], past_kv_cache=cache)
        caches.append(cache)
        logits.append(torch.cat([first, second], dim=1))
    assert_identical(logits[0], logits[1])
    for once, per_layer in zip(caches[0].entries, caches[1].entries, strict=True):
        assert_identical(once.past_keys, per_layer.past_keys)
        assert_identical(once.past_values, per_layer.past_values)


def test_a_nan_in_a_cached_key_gives_the_logits_and_cache_checked_per_layer():
    model = MODELS["variant gpt2"]
    tokens, _ = batch(model, False, pos=8)
    results = []
    for run in (model, lambda *a, **k: checked_per_layer(model, *a, **k)):
        cache = KeyValueCache.empty(model.cfg, tokens.shape[0])
        run(tokens[:, :4], past_kv_cache=cache)
        cache[0].past_keys[0, 1, 0, 0] = float("nan")  # a fused kernel may hide it
        results.append((run(tokens[:, 4:], past_kv_cache=cache), cache[0].past_keys.clone()))
    assert_identical(results[0][0], results[1][0])
    assert_identical(results[0][1], results[1][1])


# ---------------------------------------------------------------- a cache's hooks do not listen
def test_caching_the_residual_stream_synchronises_once_past_the_input_check():
    model = MODELS["variant gpt2"]
    tokens, _ = batch(model, False)
    with torch.no_grad():
        model.run_with_cache(tokens, names_filter=lambda n: "resid" in n)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model.run_with_cache(tokens, names_filter=lambda n: "resid" in n)
    assert sum(e.count for e in prof.key_averages() if e.key == "aten::item") == 3


@pytest.mark.parametrize("where", ["W_Q", "W_K"])
def test_a_cache_checked_once_records_what_the_guard_per_layer_gives(where):
    # The first try's fused z hides the NaN; the cache must hold the second run's.
    model = poisoned(MODELS["variant gpt2"], where)
    tokens, _ = batch(model, False)
    names = ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z", "blocks.1.hook_resid_post"]
    _, once = model.run_with_cache(tokens, names_filter=names)
    with model.hooks(fwd_hooks=NO_OP):
        _, per_layer = model.run_with_cache(tokens, names_filter=names)
    for name in names:
        assert_identical(once[name], per_layer[name])
