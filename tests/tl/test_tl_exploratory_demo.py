"""TransformerLens's Exploratory Analysis Demo, ported: the same numbers as real TL 3.5.1.

tests/tl/tl_exploratory_demo.py is TransformerLens code in the style of that demo (indirect
object identification: logit difference, the logit lens, direct logit attribution per
layer and per head, activation patching by hand of the residual stream, attention and MLP
outputs, head outputs, values and patterns, direct path patching, previous-token /
duplicate / induction scores, ablating a head), on a small random GPT-2-style model with a
BPE tokenizer saved in a local folder instead of GPT-2 from the hub. It runs unchanged
after the alias line here and under real TransformerLens in its own environment
(tests/helpers/tl_reference.py), on the same weights; every entry of its `results` and every
number it prints must agree.
"""

from pathlib import Path
from typing import Any

import pytest
from helpers.tl_reference import (
    assert_same,
    assert_same_printout,
    demo_fixtures,
    random_weights,
    save_demo_tokenizer,
)
from torch.testing import assert_close

import hookedattn_tl

# End to end (subprocesses, torchrun, real TransformerLens): run in CI with `-m slow`.
pytestmark = pytest.mark.slow

DEMO = Path(__file__).with_name("tl_exploratory_demo.py")


@pytest.fixture(scope="module")
def given(tmp_path_factory) -> dict[str, Any]:
    """The demo's text and the globals it is given: config, weights, tokenizer folder."""
    tokenizer = save_demo_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    from transformers import AutoTokenizer

    d_vocab = len(AutoTokenizer.from_pretrained(tokenizer))
    sizes = dict(n_layers=3, n_heads=4, d_head=8, d_model=32, d_mlp=64, n_ctx=64)
    config = dict(**sizes, d_vocab=d_vocab, act_fn="gelu_new", normalization_type="LN")
    namespace = dict(
        config=config,
        weights=random_weights(hookedattn_tl, config),
        tokenizer_path=str(tokenizer),
    )
    return dict(source=DEMO.read_text(), namespace=namespace, filename=DEMO.name)


ours, theirs = demo_fixtures()


def test_the_demo_ran_on_the_facade_and_on_transformer_lens_3_5_1(ours, theirs):
    assert ours["results"]["version_module"] == "hookedattn_tl.utilities"
    assert theirs["results"]["version_module"] == "transformer_lens.utilities"
    assert theirs["version"] == "3.5.1"


def test_every_result_matches_transformer_lens(ours, theirs):
    mine, reference = dict(ours["results"]), dict(theirs["results"])
    mine.pop("version_module"), reference.pop("version_module")
    assert_same(mine, reference, "results")


def test_every_printed_number_matches_transformer_lens(ours, theirs):
    assert assert_same_printout(ours["printed"], theirs["printed"]) > 100


def test_the_logit_difference_decomposes_without_tl(ours):
    # Facts of any weights, checked where TL's environment is missing too: the final
    # stream's decomposition adds up to the model's own average logit difference.
    results = ours["results"]
    total = results["original_average_logit_diff"]
    assert_close(results["calculated_average_logit_diff"], total, atol=1e-4, rtol=1e-5)
    assert_close(results["per_layer_logit_diffs"].sum(), total, atol=1e-4, rtol=1e-5)
    assert_close(results["logit_lens_logit_diffs"][-1], total, atol=1e-4, rtol=1e-5)
    # The prompts of a clean/corrupted pair differ at one position (the second name, 10):
    # the clean stream there before block 0 restores the clean run.
    assert_close(float(results["patched_residual_stream_diff"][0, 10]), 1.0, atol=1e-4, rtol=0)
