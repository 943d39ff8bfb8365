"""TransformerLens's toy-model variants held against TransformerLens 3.5.1 itself.

`scripts/tl_toy_variants.py` runs in TL's environment (tests/helpers/tl_reference.py): it
builds each variant from its config dict, draws the weights at random there, and returns its
state dict, logits, cache and KV-cache decode, raw and after the processing TL's
`from_pretrained` applies (for a shortformer model: `fold_ln`, `center_writing_weights`
and `center_unembed` off, so only the value biases fold). Here the same state dicts load by
name into hookedattn's model (and the facade's), and every value is compared in float64.

TL 3.5.1's `process_weights` runs in float32 even for a float64 model (it casts every
weight to float32 and back), so TL's processed weights are float32 roundings: loaded here
they give TL's logits and cache to 1e-10, while our own float64 processing of the raw
weights agrees with TL's to that rounding (about 1e-7 in the weights, 1e-6 downstream).
"""

import sys

import pytest
import torch
from helpers.tl_reference import VERSION, require_tl_python, run_in_tl, script_module
from torch.testing import assert_close

import hookedattn_tl
from hookedattn import HookedTransformer, HookedTransformerConfig, KeyValueCache

# End to end (a subprocess running real TransformerLens): run in CI with `-m slow`.
pytestmark = pytest.mark.slow

EXACT = dict(rtol=1e-10, atol=1e-10)
BASE = dict(
    n_layers=2, d_model=16, d_head=4, n_heads=4, d_mlp=32, d_vocab=50, n_ctx=16,
    normalization_type="LN", dtype=torch.float64,
)  # fmt: skip
VARIANTS = {
    "solu_shortformer": dict(act_fn="solu_ln", positional_embedding_type="shortformer"),
    "solu_standard": dict(act_fn="solu_ln"),  # folds the norm over the neurons
    "attn_only_shortformer": dict(attn_only=True, positional_embedding_type="shortformer"),
    "gelu_shortformer": dict(act_fn="gelu", positional_embedding_type="shortformer"),
}
TOKENS = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(0))
PREFIX = 5  # the KV-cache run: these positions at once, then one at a time


@pytest.fixture(scope="module")
def theirs(tmp_path_factory) -> dict:
    """TransformerLens's results for every variant, from a subprocess in its environment."""
    require_tl_python()
    runs = {
        name: dict(config={**BASE, **changes}, seed=seed, tokens=TOKENS, prefix=PREFIX)
        for seed, (name, changes) in enumerate(VARIANTS.items())
    }
    return run_in_tl("tl_toy_variants.py", {"runs": runs}, tmp_path_factory.mktemp("tl"))


def our_config(name: str, **changes: object) -> dict:
    return {**BASE, **VARIANTS[name], "dtype": "float64", **changes}


def loaded(kind: str, config: dict, state: dict) -> HookedTransformer:
    """Our model (`core`) or the facade's (`facade`) of `config`, holding TL's `state`."""
    if kind == "core":
        model = HookedTransformer(HookedTransformerConfig(**config))
    else:
        model = hookedattn_tl.HookedTransformer(config)
    model.load_state_dict(state, strict=True)  # TL's names, every one of ours
    return model


def assert_runs_like(model: HookedTransformer, run: dict, **tol: float) -> None:
    """Logits and every activation TL cached, within `tol`; ours only adds norms' outputs."""
    logits, cache = model.run_with_cache(TOKENS)
    assert_close(logits, run["logits"], **tol)
    assert set(run["cache"]) <= set(cache)
    assert all(name.endswith("hook_out") for name in set(cache) - set(run["cache"]))
    for name, expected in run["cache"].items():
        assert_close(cache[name], expected, **tol, msg=name)


@pytest.mark.parametrize("kind", ["core", "facade"])
@pytest.mark.parametrize("name", VARIANTS)
def test_transformer_lens_weights_run_as_in_transformer_lens(name, kind, theirs):
    raw = theirs["runs"][name]["raw"]
    assert_runs_like(loaded(kind, our_config(name), raw["state"]), raw, **EXACT)


@pytest.mark.parametrize("name", VARIANTS)
def test_transformer_lens_processed_weights_run_as_in_transformer_lens(name, theirs):
    processed = theirs["runs"][name]["processed"]
    config = our_config(name, normalization_type=processed["normalization_type"])
    assert_runs_like(loaded("core", config, processed["state"]), processed, **EXACT)


@pytest.mark.parametrize("name", VARIANTS)
def test_our_processing_is_transformer_lens_processing(name, theirs):
    run = theirs["runs"][name]
    flags = run["processed"]["flags"]
    assert flags == script_module("tl_toy_variants").from_pretrained_flags(BASE | VARIANTS[name])
    model = loaded("facade", our_config(name), run["raw"]["state"])
    model.process_weights_(**flags)
    assert model.cfg.normalization_type == run["processed"]["normalization_type"]
    state = model.state_dict()
    assert set(state) == set(run["processed"]["state"])
    for key, expected in run["processed"]["state"].items():  # TL's are float32 roundings
        assert_close(state[key], expected, rtol=1e-6, atol=1e-6, msg=key)
    assert_runs_like(model, run["processed"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
def test_decoding_with_a_kv_cache_is_transformer_lens_decoding(name, theirs):
    run = theirs["runs"][name]["raw"]
    model = loaded("core", our_config(name), run["state"])
    cache = KeyValueCache.empty(model.cfg, TOKENS.shape[0])
    steps = [model(TOKENS[:, :PREFIX], past_kv_cache=cache)[:, -1]]
    for position in range(PREFIX, TOKENS.shape[1]):
        steps.append(model(TOKENS[:, position : position + 1], past_kv_cache=cache)[:, -1])
    assert_close(torch.stack(steps, dim=1), run["decoded"], **EXACT)


def test_the_reference_is_transformer_lens_3_5_1(theirs):
    assert theirs["version"] == VERSION
    assert sys.modules.get("transformer_lens") is None
