"""`assert_residual_identities` on hybrid models: every block's sums (a mixer's write in
attention's place or beside it, a block of an MLP alone), what each mixer reads and writes,
the causality of its mixing, and a change to any of these named."""

import functools

import pytest
import torch

from hookedattn import ActivationCache
from hookedattn.testing import assert_residual_identities
from tests.helpers.mixers import (
    KIND_SETTINGS,
    beside_attention_cfg,
    hybrid_cfg,
    one_sublayer_cfg,
    random_hybrid,
)

TOKENS = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(4))
LAYOUTS = {
    "mamba2 and a short convolution": (("mamba2", "attention", "short_conv"), {}),
    "gated delta": (("gated_delta", "attention"), {}),
    "mamba": (("mamba", "attention"), KIND_SETTINGS["mamba"]),
    "rg_lru and kimi delta": (("rg_lru", "attention", "kimi_delta"), KIND_SETTINGS["kimi_delta"]),
    "lightning": (("lightning", "attention"), KIND_SETTINGS["lightning"]),
}


@functools.cache
def _model(layout: str, dtype: torch.dtype = torch.float64, **flags):
    if layout == "beside the attention":
        cfg = beside_attention_cfg(dtype)
    elif layout == "one sublayer per block":
        cfg = one_sublayer_cfg(dtype)
    else:
        kinds, settings = LAYOUTS[layout]
        cfg = hybrid_cfg(kinds, dtype, **settings)
    return random_hybrid(cfg.replace(**flags), 3)


def _checked(model) -> tuple[str, ...]:
    _, cache = model.run_with_cache(TOKENS)
    check = assert_residual_identities(model, cache)
    assert check.skipped == ()
    return check.checked


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("layout", [*LAYOUTS, "beside the attention", "one sublayer per block"])
def test_identities_hold_on_every_hybrid_layout(layout, dtype):
    model = _model(layout, dtype)
    checked = " ".join(_checked(model))
    for layer, block in enumerate(model.blocks):
        if hasattr(block, "mixer"):
            assert f"blocks.{layer}.mixer.hook_in ==" in checked
            assert f"blocks.{layer}.mixer.hook_out" in checked
        assert f"blocks.{layer}.hook_resid_post ==" in checked


def test_a_mixer_block_sums_its_write_and_its_mixing_is_causal():
    checked = _checked(_model("mamba2 and a short convolution", use_hook_mixer_in=True))
    assert "blocks.0.hook_mixer_in == blocks.0.hook_resid_pre" in checked
    assert "blocks.0.mixer.hook_in == blocks.0.ln1.hook_out" in checked
    assert "blocks.0.hook_attn_out == blocks.0.mixer.hook_out" in checked
    assert "blocks.0.hook_resid_mid == blocks.0.hook_resid_pre + blocks.0.hook_attn_out" in checked
    assert "blocks.0.mixer.hook_mixing is 0 on every key after its query" in checked


def test_falcon_h1s_block_adds_both_writes():
    checked = _checked(_model("beside the attention"))
    assert ("blocks.1.hook_resid_mid == blocks.1.hook_resid_pre + blocks.1.hook_attn_out + "
            "blocks.1.hook_mixer_out") in checked  # fmt: skip
    assert "blocks.1.hook_mixer_out == blocks.1.mixer.hook_out" in checked


def test_a_block_of_an_mlp_alone_adds_its_mlp_to_the_stream_it_reads():
    checked = _checked(_model("one sublayer per block"))
    assert "blocks.1.hook_resid_post == blocks.1.hook_resid_pre + blocks.1.hook_mlp_out" in checked
    assert "blocks.0.hook_resid_post == blocks.0.hook_resid_pre + blocks.0.hook_attn_out" in checked


def test_lightning_attentions_heads_read_their_pattern_of_values():
    checked = " ".join(_checked(_model("lightning")))
    assert "blocks.0.mixer.hook_o == blocks.0.mixer.hook_pattern @ blocks.0.mixer.hook_v" in checked


def test_a_gated_delta_nets_heads_read_their_mixing_of_values():
    checked = " ".join(_checked(_model("gated delta")))
    assert "blocks.0.mixer.hook_o == blocks.0.mixer.hook_mixing @ blocks.0.mixer.hook_v" in checked


@pytest.mark.parametrize(
    "name, index, statement",
    [
        ("blocks.0.mixer.hook_out", (1, 3, 5), "blocks.0.hook_attn_out == blocks.0.mixer.hook_out"),
        ("blocks.0.mixer.hook_mixing", (0, 1, 2, 4), "blocks.0.mixer.hook_mixing is 0 on every"),
        ("blocks.2.mixer.hook_in", (0, 2, 1), "blocks.2.mixer.hook_in == blocks.2.ln1.hook_out"),
    ],
)
def test_a_changed_mixer_activation_fails_naming_its_identity(name, index, statement):
    model = _model("mamba2 and a short convolution")
    _, cache = model.run_with_cache(TOKENS)
    value = cache[name].clone()
    value[index] += 0.25
    broken = ActivationCache({**cache, name: value}, cache.n_layers, cache.has_batch_dim)
    with pytest.raises(AssertionError) as failure:
        assert_residual_identities(model, broken)
    assert statement in str(failure.value)
