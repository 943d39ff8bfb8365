"""OLMo Hybrid imported by convention: gated delta net layers normed before their sublayers
(Qwen3-Next's way) and attention layers normed after theirs (OLMo 2's), our
`placement_layers`; its convolution kept in its files as three (`q_conv1d`, `k_conv1d`,
`v_conv1d`), read as one (`_joined`). Each is compared with `transformers` on a tiny random
twin: the logits, every residual stream and the sublayers' writes, greedy generation, and the
checkpoint's files against the live model.

`transformers` runs its RMSNorms and its delta rule in float32 whatever the model's dtype, so
a float64 twin agrees with our float64 import to float32's rounding only: on seed 3 the
logits are 1.0e-5 of their scale apart in float32 and 5.8e-6 in float64, the residual
streams 2.7e-6 in float64; the bound is 1e-4, as for the other gated delta twins
(`test_hybrid.py`), whose delta rule amplifies rounding. The float64 exactness of the gated
delta net itself is checked against its recurrence in `tests/core/test_gated_delta.py`.
"""

import pytest
import torch
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import (
    assert_decomposition_sums,
    assert_files_read_as_the_live_model,
    relative_worst,
    streams_worst,
    write_worst,
)
from torch.nn.functional import conv1d

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
from hookedattn.core.hf import _tiny  # noqa: E402
from hookedattn.core.hf._joined import joined  # noqa: E402
from hookedattn.core.hf._table import Rule, StateDict, Table  # noqa: E402

TOKENS = torch.tensor(
    [[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12], [9, 2, 2, 71, 30, 6, 5, 14, 100, 3, 3, 50]]
)
ROUNDING = 1e-4  # of each tensor's largest value (module docstring)


@pytest.fixture
def memo(tmp_path, monkeypatch):
    """A memo of the test's own: the test verifies afresh (the others share the session's)."""
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))


def twin(seed: int = 0, **fields) -> torch.nn.Module:
    """A tiny random OLMo Hybrid (its default: three gated delta layers, then attention)."""
    config = transformers.AutoConfig.for_model("olmo_hybrid", **fields)
    model_class = transformers.OlmoHybridForCausalLM
    return _tiny.random_hf_model(model_class, _tiny.tiny_config(config), seed=seed)


def test_each_layer_kind_places_its_norms_as_transformers_does():
    model = HookedTransformer.from_hf(twin(seed=3).double())
    assert model.cfg.mixers.layers == ("gated_delta",) * 3 + ("attention",)
    assert model.cfg.placement_layers == ("pre", "pre", "pre", "post")
    assert model.cfg.mixers.delta_beta_scale == 2.0  # linear_allow_neg_eigval
    norms = {n.split(".", 2)[2] for n, _ in model.named_parameters() if ".ln" in n}
    assert norms == {"ln1.w", "ln2.w", "ln1_post.w", "ln2_post.w"}
    assert not hasattr(model.blocks[0].ln1_post, "w") and not hasattr(model.blocks[3].ln1, "w")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logits_and_every_residual_stream_are_transformers(dtype):
    reference = twin(seed=3).to(dtype)
    model = HookedTransformer.from_hf(reference)
    assert streams_worst(model, reference, TOKENS) <= ROUNDING


# Our hook point -> (the layer, its piece whose output it is).
WRITES = {
    "blocks.0.mixer.hook_out": (0, "linear_attn"),
    "blocks.0.hook_mlp_out": (0, "mlp"),
    "blocks.3.hook_attn_out": (3, "post_attention_layernorm"),
    "blocks.3.hook_mlp_out": (3, "post_feedforward_layernorm"),
}


@pytest.mark.parametrize("ours", WRITES)
def test_each_sublayers_write_is_transformers(ours):
    reference = twin(seed=4).double()
    assert write_worst(reference, ours, *WRITES[ours], TOKENS) <= ROUNDING


def test_greedy_generation_is_transformers():
    assert torch.equal(*greedy_ours_and_transformers(twin(seed=5), TOKENS[:, :5]))


def test_the_decomposition_of_an_import_sums_to_the_stream():
    model = HookedTransformer.from_hf(twin(seed=6).double())
    assert_decomposition_sums(model, TOKENS, ("sublayer", "head"))


def test_the_files_keep_three_convolutions_read_as_the_live_one(tmp_path):
    reference = twin(seed=7)
    reference.save_pretrained(tmp_path)
    from safetensors import safe_open

    with safe_open(next(tmp_path.glob("*.safetensors")), "pt") as files:
        names = set(files.keys())
    assert "model.layers.0.linear_attn.q_conv1d.weight" in names
    assert "model.layers.0.linear_attn.conv1d.weight" not in names
    assert_files_read_as_the_live_model(reference, tmp_path)


def test_three_depthwise_convolutions_are_one_over_their_channels_stacked():
    generator = torch.Generator().manual_seed(8)
    widths, taps = (4, 4, 6), 3
    x = [torch.randn(2, w, 9, generator=generator, dtype=torch.float64) for w in widths]
    w = [torch.randn(n, 1, taps, generator=generator, dtype=torch.float64) for n in widths]

    def causal(inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        padded = torch.nn.functional.pad(inputs, (taps - 1, 0))
        return conv1d(padded, weight, groups=weight.shape[0])

    apart = torch.cat([causal(xi, wi) for xi, wi in zip(x, w, strict=True)], dim=1)
    assert torch.equal(causal(torch.cat(x, dim=1), torch.cat(w)), apart)


def test_a_joined_name_reads_its_pieces_rows_and_hides_them():
    pieces = {"a": torch.ones(2, 3), "b": torch.zeros(1, 3), "c": torch.full((4,), 7.0)}
    table = Table(rules=(Rule("W", "a+b", "rows d -> rows d"),))
    source = joined(StateDict(pieces), table)
    assert source.shapes == {"a+b": (3, 3), "c": (4,)}
    assert torch.equal(source.get("a+b"), torch.cat([pieces["a"], pieces["b"]]))


def test_mixer_layers_whose_norms_differ_in_epsilon_are_refused():
    from hookedattn.core.hf import _mixer_norms
    from hookedattn.core.hf._probes import norm_kind

    reference = twin(seed=9)
    layers = list(reference.model.layers)
    attention = [
        ("ln1_post", "post_attention_layernorm"),
        ("ln2_post", "post_feedforward_layernorm"),
    ]
    kind = norm_kind([layers[3].post_attention_layernorm], (1e-6,))
    for norm in (layers[0].input_layernorm, layers[0].post_attention_layernorm):
        norm.variance_epsilon = 1e-3  # unlike the attention layers' norms
    with pytest.raises(ValueError, match=r"the mixer layers' norms are \('rms', False, 0.001\)"):
        _mixer_norms.read(reference, (layers, [3]), "linear_attn", "mlp",
                          (attention, (1.0, 1.0)), (kind, (1e-6,)))  # fmt: skip


def test_the_released_form_without_rope_attends_without_positions():
    # The released checkpoints set no `rope_theta`: transformers builds no rotary then.
    reference = twin(seed=10, rope_parameters={"rope_type": "default", "rope_theta": None})
    assert reference.model.rotary_emb is None
    model = HookedTransformer.from_hf(reference.double())
    assert model.cfg.positional_embedding_type == "none"
    with torch.no_grad():
        assert relative_worst(model(TOKENS), reference(TOKENS).logits) <= ROUNDING


def test_the_anatomy_round_trips_through_the_memo(memo):
    from hookedattn.core.hf import _anatomy

    config = twin().config
    first = _anatomy.recognise(config)  # read off the twin, then remembered
    again = _anatomy.recognise(config)  # read from the memo's JSON
    assert again == first
    assert again.mixer_norms == (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm"))
