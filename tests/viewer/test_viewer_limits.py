"""Sizes and errors of the viewer's pages: nothing allocates more than the input justifies,
every refusal names the limit and how to raise it, and a page whose data is not finite
names its first such value. (The command line's limits: tests/project/test_cli.py.)"""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from analysis import decompose_resid, direct_logit_attribution, view
from hookedattn import ByteTokenizer
from hookedattn.testing import random_tiny_model
from hookedattn.viewer import Page, attention, float32_base64

ROOT = Path(__file__).resolve().parents[2]


def byte_model(n_ctx: int = 64):
    fields = dict(n_layers=2, n_heads=4, n_ctx=n_ctx, d_vocab=259, attn_only=True)
    return random_tiny_model(randomize_seed=3, tokenizer=ByteTokenizer(), **fields).eval()


def never_run(x, hook):
    raise AssertionError("the model ran before the page's size was checked")


# ------------------------------------------------------------------ the attention page
@pytest.mark.parametrize("n_tokens", [16_000, 100_000])
def test_a_huge_attention_page_is_refused_before_the_model_runs(n_tokens):
    """Guards: 16k tokens ran into a MemoryError at 6.8 GB, 100k asked for 10 GB."""
    model = byte_model(n_ctx=200_000)
    model.add_hook("hook_embed", never_run)
    with pytest.raises(ValueError, match=r"pattern values .* more than max_values=8,388,608: .*"
                       r"layers=\[\.\.\.\].* raise max_values \(--max-values"):  # fmt: skip
        attention(model, "x" * n_tokens)


def test_max_values_is_the_limit_both_ways():
    """Guards: the limit is max_values exactly, and raising it makes the page."""
    model = byte_model()
    text = "abcabc"  # 7 tokens with <bos>: 2 layers x 4 heads x 49 = 392 values
    with pytest.raises(ValueError, match=r"= 392 pattern values .* max_values=391"):
        attention(model, text, max_values=391)
    assert len(attention(model, text, max_values=392).data["tokens"]) == 7
    assert attention(model, text, layers=[1], max_values=196).data["layers"] == [1]


# Under the suite's type checks a float layer never reaches `attention`; a user's call does.
PLAIN_CALLS = """
import numpy, torch
from hookedattn import ByteTokenizer
from hookedattn.testing import random_tiny_model
from hookedattn.viewer import attention
model = random_tiny_model(n_layers=2, n_heads=4, n_ctx=64, d_vocab=259, attn_only=True,
                          randomize_seed=3, tokenizer=ByteTokenizer()).eval()
for kwargs in [dict(layers=[0.5]), dict(layers=[1, 1.9]), dict(layers=[True]),
               dict(max_values=-1), dict(max_values=1.5)]:
    try:
        attention(model, "abc", **kwargs)
        print("made a page")
    except ValueError as error:
        print(error)
print(attention(model, "abc", layers=[numpy.int64(1), torch.tensor(0)]).data["layers"])
"""


def test_float_layers_and_a_bad_max_values_are_refused_in_plain_use():
    """Guards: layers=[0.5] drew layer 0 and [1, 1.9] layer 1 twice (int() cut them);
    max_values=-1 or 1.5 was taken as a size. Numpy and tensor ints still choose layers."""
    done = subprocess.run([sys.executable, "-c", PLAIN_CALLS], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines[:3] == [
        "layers must be a non-empty list of ints in 0..1, got [0.5]",
        "layers must be a non-empty list of ints in 0..1, got [1, 1.9]",
        "layers must be a non-empty list of ints in 0..1, got [True]",
    ]
    assert lines[3:] == [
        "max_values must be a positive int, got -1",
        "max_values must be a positive int, got 1.5",
        "[1, 0]",
    ]


def test_a_cache_too_large_for_a_page_is_refused_too():
    """Guards: the limit holds for patterns already cached, not only for text."""
    model = byte_model()
    _, cache = model.run_with_cache(model.to_tokens("abcabc"))
    with pytest.raises(ValueError, match=r"max_values=100"):
        attention(model, cache, max_values=100)


def test_base64_of_patterns_is_their_float32_bytes():
    """The encoding without a Python float per value reads back as the same float32."""
    values = torch.randn(3, 5, 7, dtype=torch.float64)
    decoded = torch.frombuffer(bytearray(__import__("base64").b64decode(float32_base64(values))),
                               dtype=torch.float32)  # fmt: skip
    assert torch.equal(decoded, values.float().flatten())


# ------------------------------------------------------------------ non-finite results
def test_a_page_of_nan_values_names_the_first_one():
    """Guards: view.logit_attribution on a NaN model failed in the JSON encoder
    ("Out of range float values are not JSON compliant"), naming nothing."""
    model = byte_model()
    with torch.no_grad():
        model.embed.W_E[ord("b")] = math.nan
    tokens = model.to_tokens("abcabc")
    _, cache = model.run_with_cache(tokens)
    dla = direct_logit_attribution(model, cache, decompose_resid(model, cache), tokens)
    with pytest.raises(ValueError, match=r"bars page's data holds \d+ NaN or infinite value\(s\), "
                       r"first data\['values'\]\[2\]"):  # fmt: skip
        view.logit_attribution(model, cache, dla)
    with pytest.raises(ValueError, match=r"first data\['x'\]\[1\] = inf"):
        Page("t", {"kind": "bars", "x": [1.0, math.inf]})
