"""TransformerLens's activation-patching demo, ported: the same numbers as real TL 3.5.1.

tests/tl/tl_patching_demo.py is TransformerLens code in the style of
Activation_Patching_in_TL_Demo: `transformer_lens.patching` on indirect object
identification (the residual stream, head outputs over all positions and by position,
every block, every head's output, query, key, value and pattern), then on induction in an
attention-only model, corrupting either half of a repeated sequence. Its two hub models
(GPT-2 small, attn-only-2l) are small random models of the same families here, with a BPE
tokenizer saved in a local folder. It runs unchanged after the alias line here and under
real TransformerLens in its own environment (tests/helpers/tl_reference.py), on the same weights;
every patching result and every number it prints must agree.
"""

from pathlib import Path
from typing import Any

import pytest
import torch
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

DEMO = Path(__file__).with_name("tl_patching_demo.py")


@pytest.fixture(scope="module")
def given(tmp_path_factory) -> dict[str, Any]:
    """The demo's text and the globals it is given: both models and the tokenizer folder."""
    tokenizer = save_demo_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    from transformers import AutoTokenizer

    d_vocab = len(AutoTokenizer.from_pretrained(tokenizer))
    sizes = dict(n_layers=2, n_heads=4, d_head=8, d_model=32, n_ctx=64, d_vocab=d_vocab)
    config = dict(**sizes, d_mlp=64, act_fn="gelu_new", normalization_type="LN")
    attn_only_config = dict(**sizes, attn_only=True, normalization_type="LN")
    namespace = dict(
        config=config,
        weights=random_weights(hookedattn_tl, config),
        attn_only_config=attn_only_config,
        attn_only_weights=random_weights(hookedattn_tl, attn_only_config, seed=1),
        tokenizer_path=str(tokenizer),
    )
    return dict(source=DEMO.read_text(), namespace=namespace, filename=DEMO.name)


ours, theirs = demo_fixtures()


def test_the_demo_ran_on_the_facade_and_on_transformer_lens_3_5_1(ours, theirs):
    assert ours["results"]["version_module"] == "hookedattn_tl"
    assert theirs["results"]["version_module"] == "transformer_lens"
    assert theirs["version"] == "3.5.1"


def test_every_patching_result_matches_transformer_lens(ours, theirs):
    mine, reference = dict(ours["results"]), dict(theirs["results"])
    mine.pop("version_module"), reference.pop("version_module")
    assert len(reference) == 11
    assert_same(mine, reference, "results")


def test_every_printed_number_matches_transformer_lens(ours, theirs):
    assert assert_same_printout(ours["printed"], theirs["printed"]) > 20


def test_patching_the_clean_stream_restores_the_clean_run_without_tl(ours):
    # Facts of any weights, checked where TL's environment is missing too. The corrupted
    # prompts differ from the clean ones at one position only (the second name, 10):
    # patching the clean stream there before block 0 restores the clean run (metric 1),
    # and anywhere else changes nothing (0).
    resid_pre = ours["results"]["resid_pre Activation Patching"]
    assert_close(float(resid_pre[0, 10]), 1.0, atol=1e-4, rtol=0)
    others = torch.cat([resid_pre[0, :10], resid_pre[0, 11:]])
    assert_close(others, torch.zeros_like(others), atol=1e-4, rtol=0)
    # The block-wise patching's first map is the residual stream's.
    blocks = ours["results"]["Activation Patching Per Block"]
    assert_close(blocks[0], resid_pre, atol=1e-6, rtol=0)
