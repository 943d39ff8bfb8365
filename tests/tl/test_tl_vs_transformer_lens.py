"""hookedattn_tl against TransformerLens 3.5.1 itself, by value, on the same random weights.

TransformerLens runs in an environment of its own (`.ci/transformer_lens.sh` builds it and
links it at `~/.cache/hookedattn/transformer_lens-3.5.1/`; `HOOKEDATTN_TL_PYTHON` names
another interpreter), as a subprocess: `scripts/tl_probes.py` there runs TL's API on the
weights we give it. The same probe code runs here on `hookedattn_tl`, and every result is
compared: the cache's analysis methods with their options, every patching function (the
pattern setters by destination and source position included), hook levels, start and stop
layers, the key/value cache, generation, FactoredMatrix, utils; every cached activation of
eight model variants; every number of the Main-Demo script (tests/tl/tl_main_demo.py), which
runs unchanged under TL and after the alias line here. Layer arguments spelled from the
end (`-2`) are held against TL's positive spelling (TL itself reads only `-1` so).

Without that environment the tests skip, saying how to build it; under CI (`CI` set) they
fail instead, so CI always runs them.
"""

import sys
from typing import Any

import pytest
import torch
from helpers.tl_reference import VERSION, assert_same, require_tl_python, run_in_tl, script_module

import hookedattn_tl

# End to end (subprocesses, torchrun, real TransformerLens): run in CI with `-m slow`.
pytestmark = pytest.mark.slow

# Families both implement; the gated MLP without b_in: TransformerLens 3.5 adds b_in after
# the gate's product (`act(x W_gate) * (x W_in) + b_in`), we inside it (`act(x W_gate) *
# (x W_in + b_in)`, as `hook_pre_linear` says); Llama-style models have no b_in.
VARIANTS = {
    "default": {},
    "attn_only": dict(attn_only=True),
    "rms": dict(normalization_type="RMS"),
    "no_norm": dict(normalization_type=None),
    "grouped_query": dict(n_key_value_heads=2),
    "rotary": dict(positional_embedding_type="rotary", rotary_dim=8),
    "parallel": dict(parallel_attn_mlp=True),
    "gated_silu": dict(gated_mlp=True, act_fn="silu", normalization_type="RMS"),
}

# The groups of probes (scripts/tl_probes.py), each a test.
GROUPS = (
    "accumulated_resid",
    "decompose_resid",
    "stack_head_results",
    "stack_neuron_results",
    "full_resid_decomposition",
    "neuron_results",
    "stack_activation",
    "apply_ln_to_stack",
    "logit_attrs",
    "residual_directions",
    "cache_keys",
    "cache_shorthand",
    "patching",
    "hooks",
    "stop_at_layer",
    "start_at_layer",
    "kv_cache",
    "generate",
    "composition",
    "accumulated_bias",
    "OV",
    "QK",
    "factored",
    "utils",
    "logits",
    "loss",
    "loss_per_token",
    "n_params_total",
    "cfg",
)
# Groups whose calls take a layer argument that the from-end spelling changes.
LAYERED = (
    "accumulated_resid",
    "decompose_resid",
    "stack_head_results",
    "stack_neuron_results",
    "full_resid_decomposition",
    "stack_activation",
    "apply_ln_to_stack",
)


def random_weights(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every parameter drawn at random, biases and gains too, so that every term matters."""
    model = hookedattn_tl.HookedTransformer(hookedattn_tl.HookedTransformerConfig(**config))
    generator = torch.Generator().manual_seed(seed)
    weights = {
        name: torch.randn(t.shape, generator=generator) * 0.3 + name.endswith(".w")
        for name, t in model.state_dict().items()
    }
    if config.get("gated_mlp"):
        weights = {n: t * 0 if n.endswith("mlp.b_in") else t for n, t in weights.items()}
    return weights


@pytest.fixture(scope="module")
def setup(main_demo, tmp_path_factory) -> dict[str, Any]:
    """The inputs both sides run on: the probes' model, the demo, the cached-run variants."""
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, main_demo.config["d_vocab"], (3, 10), generator=generator)
    runs = {}
    for name, changes in VARIANTS.items():
        config = {**main_demo.config, **changes}
        runs[name] = dict(config=config, weights=random_weights(config), tokens=tokens)
    return dict(
        config=main_demo.config,
        weights=random_weights(main_demo.config),
        demo=main_demo.source,
        cached_runs=runs,
    )


@pytest.fixture(scope="module")
def theirs(setup, tmp_path_factory) -> dict[str, Any]:
    """Real TransformerLens's results, from a subprocess in its environment."""
    require_tl_python()
    return run_in_tl("tl_probes.py", setup, tmp_path_factory.mktemp("tl"))


@pytest.fixture(scope="module")
def ours(setup) -> dict[str, Any]:
    """hookedattn_tl's results of the same probes (layers spelled as TL does)."""
    return script_module("tl_probes").probes(hookedattn_tl, setup["weights"], setup["config"])


@pytest.fixture(scope="module")
def ours_from_end(setup) -> dict[str, Any]:
    """hookedattn_tl's results with every layer argument spelled from the end."""
    return script_module("tl_probes").probes(hookedattn_tl, setup["weights"], setup["config"], True)


def test_the_probes_are_the_same_set(ours, theirs):
    assert set(ours) == set(theirs["probes"])
    assert {key.split("/")[0] for key in ours} == set(GROUPS)


@pytest.mark.parametrize("group", [g for g in GROUPS if g != "cache_keys"])
def test_probes_match_transformer_lens(group, ours, theirs):
    keys = sorted(k for k in theirs["probes"] if k.split("/")[0] == group)
    assert keys
    for key in keys:
        assert_same(ours[key], theirs["probes"][key], key)


@pytest.mark.parametrize("when", ["cache_keys", "cache_keys/after_analysis"])
def test_the_cache_holds_every_activation_tl_caches(when, ours, theirs):
    # ... and each norm's output (`hook_out`, after its gain and bias), which TL has not;
    # after the analysis calls, both hold the per-head results stack_head_results adds.
    extra = set(ours[when]) - set(theirs["probes"][when])
    assert set(theirs["probes"][when]) <= set(ours[when])
    assert extra and all(name.endswith("hook_out") for name in extra)


@pytest.mark.parametrize("group", LAYERED)
def test_layers_from_the_end_match_transformer_lens(group, ours_from_end, theirs):
    keys = sorted(k for k in theirs["probes"] if k.split("/")[0] == group)
    assert keys
    for key in keys:
        assert_same(ours_from_end[key], theirs["probes"][key], f"{key} (from the end)")


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_cached_activation_matches(variant, setup, theirs):
    run = setup["cached_runs"][variant]
    mine = script_module("tl_probes").cached_run(
        hookedattn_tl, run["weights"], run["config"], run["tokens"]
    )
    reference = theirs["cached_runs"][variant]
    assert_same(mine["logits"], reference["logits"], "logits")
    assert set(reference["cache"]) <= set(mine["cache"])
    for name, expected in reference["cache"].items():
        assert_same(mine["cache"][name], expected, name)


def test_main_demo_gives_transformer_lens_numbers(main_demo, setup, theirs):
    namespace = {"weights": setup["weights"], "config": main_demo.config}
    hookedattn_tl.install()
    try:
        exec(compile(main_demo.source, str(main_demo.path), "exec"), namespace)
    finally:
        hookedattn_tl.uninstall()
    mine, reference = dict(namespace["results"]), dict(theirs["demo"])
    assert mine.pop("version_module") == "hookedattn_tl"
    assert reference.pop("version_module") == "transformer_lens"
    assert set(mine) == set(reference)
    for key, value in reference.items():
        assert_same(mine[key], value, key)


def test_the_reference_is_transformer_lens_3_5_1(theirs):
    assert theirs["version"] == VERSION
    assert sys.modules.get("transformer_lens") is None
