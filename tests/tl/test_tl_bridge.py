"""TransformerLens 4's entry, `TransformerBridge.boot_transformers`, after the alias line.

The same local tiny GPT-2, and a tiny Llama (random weights, saved with transformers), are
booted by real TransformerLens 4.3 in its own environment (scripts/tl4_probes.py, a
subprocess) and by hookedattn_tl, with and without `enable_compatibility_mode()`; logits,
every cached activation by TL 4's hook names and two hooked runs must agree. The checks without TL 4
hold the aliases, the errors and the processing to what TL 4.3 does.
"""

import logging
from pathlib import Path

import pytest
import torch
from helpers.tl_reference import run_in_tl4, save_tiny_gpt2, save_tiny_llama, script_module
from torch.testing import assert_close

import hookedattn_tl
from hookedattn_tl.model_bridge import hook_names

# Two prompts of the same length in tokens (no padding), each word one token.
PROMPTS = [
    "When John and Mary went to the shops, John gave the bag to Mary",
    "When Tom and James went to the park, James gave the ball to Tom",
]

# float32 forwards of two implementations: their rounding differs, not their math.
ATOL = 1e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"))


@pytest.fixture(scope="module")
def bridge_cls():
    """TL 4's import line after the alias line; the alias is removed after this module."""
    hookedattn_tl.install()
    from transformer_lens.model_bridge import TransformerBridge

    yield TransformerBridge
    hookedattn_tl.uninstall()


@pytest.fixture(scope="module")
def bridge(folder, bridge_cls):
    return bridge_cls.boot_transformers(str(folder), device="cpu", dtype=torch.float32)


# ------------------------------------------------------------------ against TL 4.3
# GPT-2 (learned positions, LayerNorm, fused QKV) and Llama (rotary, RMS norms, grouped-query
# attention, gated MLP): TL 4 names the components of each after its adapter.
SAVERS = {"gpt2": save_tiny_gpt2, "llama": save_tiny_llama}
# How many activations TL 4 caches for each, and how many of them no hook point here sees
# (token ids and positions; the rotary tables' input and angles).
# TL 4's raw Llama also caches the gated MLP's two inputs (mlp.gate.hook_in, mlp.in.hook_in).
CACHED = {
    ("gpt2", "raw"): (93, 2),
    ("gpt2", "compat"): (93, 2),
    ("llama", "raw"): (105, 8),
    ("llama", "compat"): (101, 8),
}


@pytest.fixture(scope="module", params=sorted(SAVERS))
def compared(request, tmp_path_factory, bridge_cls) -> tuple[str, dict, dict]:
    """(architecture, TL 4.3's probes, ours) on the same saved model."""
    arch = request.param
    folder = SAVERS[arch](tmp_path_factory.mktemp(f"tiny_{arch}"))
    given = {"folder": str(folder), "text": PROMPTS}
    tl4 = run_in_tl4("tl4_probes.py", given, tmp_path_factory.mktemp("tl4"))
    # The same probe code, with `transformer_lens` resolving to hookedattn_tl; our cache
    # read by every name TL 4's lists.
    names = list(dict.fromkeys([*tl4["raw"]["cache"], *tl4["compat"]["cache"]]))
    return arch, tl4, script_module("tl4_probes").probes(str(folder), PROMPTS, names)


def _close(ours: torch.Tensor, theirs: torch.Tensor, where: str) -> float:
    """Assert agreement; the largest |difference|. TL 4's raw mode masks attention scores
    with the dtype's minimum where ours (and TL 3, and TL 4's compatibility mode) uses -inf."""
    masked = theirs <= torch.finfo(theirs.dtype).min / 2
    if masked.any():
        assert torch.isneginf(ours[masked]).all(), where
        ours, theirs = ours[~masked], theirs[~masked]
    assert_close(ours, theirs, atol=ATOL, rtol=1e-5, msg=lambda m: f"{where}: {m}")
    return float((ours - theirs).abs().max()) if ours.numel() else 0.0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raw", "compat"])
def test_logits_and_hooked_runs_match_transformer_lens_4(compared, mode):
    _, tl4, ours = compared
    assert tl4["version"] == "4.3.0"
    assert torch.equal(ours[mode]["tokens"], tl4[mode]["tokens"])
    for part in ("logits", "ablated", "patched"):
        _close(ours[mode][part], tl4[mode][part], f"{mode} {part}")
    # The hooks changed something: the comparison of hooked runs is not a no-op.
    assert (tl4[mode]["ablated"] - tl4[mode]["logits"]).abs().max() > 1e-3
    assert (tl4[mode]["patched"] - tl4[mode]["logits"]).abs().max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["raw", "compat"])
def test_every_cached_activation_matches_by_tl4_names(compared, mode):
    arch, tl4, ours = compared
    cache, theirs = ours[mode]["cache"], tl4[mode]["cache"]
    missing = [name for name in theirs if name not in cache]
    # Each TL 4 name is either compared by value or one we say, by name, is not here.
    assert all(hook_names.unavailable_message(name) for name in missing), [
        name for name in missing if not hook_names.unavailable_message(name)
    ]
    for name in set(theirs) - set(missing):
        _close(cache[name], theirs[name], f"{arch} {mode} {name}")
    assert (len(theirs), len(missing)) == CACHED[arch, mode]


# ------------------------------------------------------------------ without TL 4
def test_boot_returns_the_facade_model_with_raw_weights(bridge, bridge_cls, folder):
    assert isinstance(bridge, hookedattn_tl.HookedTransformer)
    assert type(bridge) is bridge_cls and bridge.compatibility_mode is False
    assert hasattr(bridge.blocks[0].ln1, "w")  # not folded: TL 4 returns HF's weights
    from transformers import GPT2LMHeadModel

    hf = GPT2LMHeadModel.from_pretrained(folder).eval()
    tokens = bridge.to_tokens(PROMPTS[0])
    with torch.no_grad():
        assert_close(bridge(tokens), hf(tokens).logits, atol=ATOL, rtol=1e-5)


def test_compatibility_mode_processes_as_tl3_from_pretrained(folder, bridge_cls):
    bridge = bridge_cls.boot_transformers(str(folder), device="cpu")
    tokens = bridge.to_tokens(PROMPTS)
    raw = bridge(tokens)
    bridge.enable_compatibility_mode(disable_warnings=True)
    tl3 = hookedattn_tl.HookedTransformer.from_pretrained(str(folder))
    assert bridge.compatibility_mode and not hasattr(bridge.blocks[0].ln1, "w")
    for name, tensor in tl3.state_dict().items():
        assert_close(bridge.state_dict()[name], tensor, msg=name)
    # Folding and centring change the logits only by a constant per position.
    shift = (bridge(tokens) - raw).std(-1)
    assert_close(shift, torch.zeros_like(shift), atol=1e-4, rtol=0)


def test_a_second_processing_warns_and_does_nothing(folder, bridge_cls, caplog):
    bridge = bridge_cls.boot_transformers(str(folder), device="cpu")
    bridge.enable_compatibility_mode()
    before = {n: t.clone() for n, t in bridge.state_dict().items()}
    with caplog.at_level(logging.WARNING):
        bridge.enable_compatibility_mode()
    assert "already applied" in caplog.text
    for name, tensor in bridge.state_dict().items():
        assert torch.equal(tensor, before[name])


def test_no_processing_keeps_the_weights(folder, bridge_cls, bridge):
    other = bridge_cls.boot_transformers(str(folder), device="cpu")
    other.enable_compatibility_mode(no_processing=True)
    assert other.compatibility_mode
    tokens = bridge.to_tokens(PROMPTS[0])
    assert torch.equal(other(tokens), bridge(tokens))


def test_tl4_names_are_aliases_of_our_hook_points(bridge):
    points = bridge.hook_dict
    assert points["blocks.0.hook_in"] is points["blocks.0.hook_resid_pre"]
    assert points["blocks.1.attn.o.hook_in"] is points["blocks.1.attn.hook_z"]
    assert points["blocks.0.mlp.in.hook_out"] is points["blocks.0.mlp.hook_pre"]
    assert points["ln_final.hook_in"] is points["blocks.1.hook_resid_post"]
    assert points["hook_unembed"] is points["unembed.hook_out"]
    assert "blocks.0.attn.q.hook_out" in points and "blocks.0.hook_nothing" not in points
    assert "blocks.0.hook_in" not in list(points)  # iteration: our names only
    assert hookedattn_tl.utils.get_act_name("in", 1) == "blocks.1.hook_in"


def test_filters_see_tl4_names_and_hooks_attach_by_them(bridge):
    tokens = bridge.to_tokens(PROMPTS[0])
    _, cache = bridge.run_with_cache(tokens, names_filter=lambda n: n.endswith("attn.hook_out"))
    assert sorted(cache) == ["blocks.0.hook_attn_out", "blocks.1.hook_attn_out"]
    seen = []
    bridge.run_with_hooks(
        tokens, fwd_hooks=[("blocks.0.mlp.out.hook_in", lambda t, hook: seen.append(hook.name))]
    )
    assert seen == ["blocks.0.mlp.hook_post"]
    assert torch.equal(cache["blocks.1.attn.hook_out"], cache["blocks.1.hook_attn_out"])
    _, cache = bridge.run_with_cache(tokens)
    assert torch.equal(cache["in", 1], cache["blocks.1.hook_resid_pre"])  # TL 4's shorthand
    assert torch.equal(cache["out", -1], cache["blocks.1.hook_resid_post"])
    assert "embed.hook_in" not in cache
    with pytest.raises(KeyError, match="does not have; use the token ids"):
        cache["embed.hook_in"]


def test_what_the_bridge_cannot_provide_says_what_to_use(bridge, bridge_cls, folder):
    with pytest.raises(KeyError, match="ln1.hook_out"):
        bridge.run_with_cache(bridge.to_tokens("When"), names_filter="blocks.0.attn.qkv.hook_in")
    with pytest.raises(AttributeError, match="from_hf"):
        bridge.original_model
    with pytest.raises(ValueError, match="device_map='auto' is not supported here; use"):
        bridge_cls.boot_transformers(str(folder), device_map="auto")
    with pytest.raises(ValueError, match="runs no model code"):
        bridge_cls.boot_transformers(str(folder), trust_remote_code=True)
    with pytest.raises(ImportError, match="boot_transformers"):
        from transformer_lens.model_bridge import ArchitectureAdapter  # noqa: F401


def test_config_overrides_reach_the_model(folder, bridge_cls):
    short = bridge_cls.boot_transformers(str(folder), n_ctx=32, load_weights=False)
    assert short.cfg.n_ctx == 32
    assert short.to_tokens(PROMPTS[0]).shape[-1] == 16  # the tokenizer came along


def test_tl4_spellings_of_the_entry_and_parameters(bridge, bridge_cls):
    import transformer_lens
    from transformer_lens.model_bridge.bridge import TransformerBridge

    assert transformer_lens.TransformerBridge is TransformerBridge is bridge_cls
    params = bridge.get_params()
    assert params["blocks.0.attn.W_Q"].shape == (4, 32, 8)
    assert dict(bridge.tl_named_parameters()).keys() == params.keys()
