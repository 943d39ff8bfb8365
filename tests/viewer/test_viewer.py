"""The viewer's pages as documents: embedded data, escaping, size, no network; and the
notebook tables. What the pages do in a browser is tested in test_viewer_browser.py."""

import base64
import dataclasses
import html
import json
import re
import struct

import pytest
import torch

from analysis import (
    activation_patch,
    apply_ln_to_stack,
    decompose_resid,
    direct_logit_attribution,
    induction_scores,
    view,
)
from hookedattn import ByteTokenizer, HookedTransformer, list_pretrained
from hookedattn.__main__ import main as cli
from hookedattn.testing import random_tiny_model
from hookedattn.viewer import Page, attention, script_json

DATA = re.compile(r'<script type="application/json" id="hookedattn-data">(.*?)</script>', re.S)


def byte_model(n_layers=2, n_heads=4, n_ctx=64):
    fields = dict(n_layers=n_layers, n_heads=n_heads, n_ctx=n_ctx, d_vocab=259, attn_only=True)
    model = random_tiny_model(
        randomize_seed=3, tokenizer=ByteTokenizer(), dtype=torch.float32, **fields
    )
    return model.eval()


def embedded(document: str) -> dict:
    (found,) = DATA.findall(document)
    return json.loads(found)


def decoded_patterns(data: dict) -> torch.Tensor:
    """The page's patterns back as `[layer head query_pos key_pos]`."""
    raw = base64.b64decode(data["patterns"]["base64"])
    values = torch.tensor(struct.unpack(f"<{len(raw) // 4}f", raw))
    n, n_layers = len(data["tokens"]), len(data["layers"])
    full = torch.zeros(n_layers, data["n_heads"], n, n)
    if data["patterns"]["triangle"]:
        full[..., torch.ones(n, n, dtype=torch.bool).tril()] = values.view(
            n_layers, -1, n * (n + 1) // 2
        )
    else:
        full[:] = values.view(full.shape)
    return full


def last_logit_99(logits):
    return logits[:, -1, 99]


@pytest.fixture(scope="module")
def model():
    return byte_model()


def test_the_page_embeds_the_caches_patterns_exactly(model):
    _, cache = model.run_with_cache("abcabc xyzxyz")
    data = embedded(attention(model, cache).html())
    expected = torch.stack([cache["pattern", layer][0] for layer in range(2)])
    assert data["patterns"]["triangle"] is True
    torch.testing.assert_close(decoded_patterns(data), expected, rtol=0, atol=0)


def test_a_non_causal_pattern_is_stored_whole(model):
    _, cache = model.run_with_cache("abcd")
    full = torch.rand(1, 4, 5, 5, generator=torch.Generator().manual_seed(0))
    edited = type(cache)({**cache, "blocks.0.attn.hook_pattern": full}, cache.n_layers)
    data = embedded(attention(model, edited, layers=[0]).html())
    assert data["patterns"]["triangle"] is False
    torch.testing.assert_close(decoded_patterns(data)[0], full[0], rtol=0, atol=0)


def test_text_is_run_and_its_tokens_shown_as_strings(model):
    data = attention(model, "ab\ncd").data
    assert data["tokens"] == model.to_str_tokens("ab\ncd")
    assert data["layers"] == [0, 1] and data["n_heads"] == 4


def test_tokens_are_read_off_the_cached_embedding(model):
    tokens = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(tokens)
    page = attention(model, cache, batch=1)
    assert page.data["tokens"] == model.to_str_tokens(tokens[1])
    assert attention(model, cache, tokens, batch=1).data["tokens"] == page.data["tokens"]


def test_without_an_embedding_the_positions_are_numbered(model):
    names = ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    _, cache = model.run_with_cache("abc", names_filter=names)
    assert attention(model, cache).data["tokens"] == ["0", "1", "2", "3"]


def test_a_script_in_the_prompt_is_data_never_markup(model):
    prompt = "</script><script>alert(1)</script><b>&amp;"
    document = attention(model, prompt, title=prompt).html()
    # Exactly the two script elements of the template: the data and the viewer.
    assert len(re.findall(r"<script\b", document)) == 2
    assert "alert(1)</script>" not in document and "<b>" not in document
    assert f"<title>{html.escape(prompt)}</title>" in document
    assert "".join(embedded(document)["tokens"]) == "<bos>" + prompt


def test_json_for_a_script_element_reads_back_as_the_same_value():
    value = {"kind": "x", "s": "</script><!-- & \u2028 {{data}}", "n": [1.5, -2]}
    text = script_json(value)
    assert not set("<>&") & set(text)
    assert json.loads(text) == value


def test_a_placeholder_inside_the_data_stays_text(model):
    page = attention(model, "{{script}}{{style}}", title="{{data}}")
    document = page.html()
    assert embedded(document)["title"] == "{{data}}"
    assert "".join(embedded(document)["tokens"]) == "<bos>{{script}}{{style}}"


def test_the_page_fetches_nothing_and_needs_nothing_outside(model):
    document = attention(model, "abc").html()
    assert "default-src 'none'" in document  # the browser refuses any request
    assert not re.search(r"\b(src|href)\s*=", document)
    urls = set(re.findall(r"https?://[^\s\"')]+", document))
    assert urls <= {"http://www.w3.org/2000/svg"}  # a namespace name, never fetched


def test_sixteen_heads_over_128_tokens_fit_in_two_megabytes():
    big = byte_model(n_layers=2, n_heads=8, n_ctx=128)
    tokens = torch.randint(0, 256, (1, 128), generator=torch.Generator().manual_seed(0))
    size = len(attention(big, tokens).html().encode("utf-8"))
    assert size < 2 * 2**20, size


def test_the_head_shown_first_is_chosen_by_label(model):
    assert attention(model, "ab", head="L1H2").data["start"] == {"index": 6, "grid": False}
    assert attention(model, "ab", head="all").data["start"]["grid"] is True
    with pytest.raises(ValueError, match=r"head in 0\.\.3"):
        attention(model, "ab", head="L1H9")
    with pytest.raises(ValueError, match="not on this page"):
        attention(model, "ab", layers=[0], head=(1, 0))


def test_bad_input_is_named(model):
    _, cache = model.run_with_cache("abc")
    with pytest.raises(ValueError, match="3 tokens given for 4 positions"):
        attention(model, cache, ["a", "b", "c"])
    with pytest.raises(ValueError, match=r"layers .* in 0\.\.1"):
        attention(model, cache, layers=[2])
    with pytest.raises(ValueError, match=r"batch must be in 0\.\.0 for this cache, got 1"):
        attention(model, cache, batch=1)
    _, sliced = model.run_with_cache("abc", pos_slice=-1)
    with pytest.raises(ValueError, match="not square"):
        attention(model, sliced)
    with pytest.raises(ValueError, match="kind"):
        Page("x", {"values": []})
    with pytest.raises(ValueError, match="0 layers has no attention"):
        attention(byte_model(n_layers=0), "abc")


def test_a_notebook_shows_the_page_in_a_sandboxed_frame(model):
    page = attention(model, "a<b")
    frame = page._repr_html_()
    assert frame.startswith("<iframe ") and 'sandbox="allow-scripts"' in frame
    srcdoc = re.search(r'srcdoc="([^"]*)"', frame).group(1)
    assert html.unescape(srcdoc) == page.html()


def test_save_writes_the_document(model, tmp_path):
    page = attention(model, "abc")
    path = page.save(tmp_path / "a.html")
    assert path.read_text(encoding="utf-8") == page.html()


def test_logit_attribution_bars_add_up_to_the_logit(model):
    tokens = model.to_tokens("abcabc")
    _, cache = model.run_with_cache(tokens)
    dla = direct_logit_attribution(
        model, cache, decompose_resid(model, cache, granularity="head"), tokens
    )
    data = embedded(view.logit_attribution(model, cache, dla).html())
    assert data["kind"] == "bars" and "L1H3" in data["labels"] and data["labels"][-1] == "b_U"
    values = torch.tensor(data["values"], dtype=torch.float64)  # [pos component]
    torch.testing.assert_close(values.T, dla.contributions[:, 0].double(), rtol=0, atol=0)
    torch.testing.assert_close(values.sum(-1), dla.total()[0].double(), rtol=1e-6, atol=1e-5)
    assert data["tokens"] == model.to_str_tokens(tokens) and data["start_pos"] == 6


def test_a_sliced_attribution_asks_for_its_tokens(model):
    tokens = model.to_tokens("abcabc")
    _, cache = model.run_with_cache(tokens)
    normed = apply_ln_to_stack(model, cache, decompose_resid(model, cache, granularity="head"))
    sliced = dataclasses.replace(normed, components=normed.components[:, :, :-1])
    dla = direct_logit_attribution(model, cache, sliced, tokens[:, 1:])
    with pytest.raises(ValueError, match="cache has 7 positions and the result 6"):
        view.logit_attribution(model, cache, dla)
    strings = model.to_str_tokens(tokens)[:-1]
    assert view.logit_attribution(model, cache, dla, strings).data["tokens"] == strings


def test_decomposition_bars_are_norms_or_projections(model):
    _, cache = model.run_with_cache("abcabc")
    decomp = decompose_resid(model, cache, granularity="head")
    norms = view.decomposition(model, cache, decomp, pos=0).data
    torch.testing.assert_close(
        torch.tensor(norms["values"], dtype=torch.float64).T,
        decomp.components[:, 0].norm(dim=-1).double(),
    )
    direction = torch.randn(16, generator=torch.Generator().manual_seed(0))
    projected = view.decomposition(model, cache, decomp, direction=direction).data
    stream = cache["resid_post", 1][0] @ direction
    torch.testing.assert_close(
        torch.tensor(projected["values"], dtype=torch.float64).sum(-1),
        stream.double(),
        rtol=1e-5,
        atol=1e-5,
    )


def _patching(model):
    clean, corrupted = model.to_tokens("abcabc"), model.to_tokens("abcxbc")
    return activation_patch(
        model, "z", clean_tokens=clean, corrupted_tokens=corrupted, metric=last_logit_99
    )


def test_patching_page_carries_scores_and_baselines(model):
    result = _patching(model)
    data = embedded(view.patching(result).html())
    assert data["axes"] == ["layer", "head"] and data["labels"] == [
        ["0", "1"],
        ["0", "1", "2", "3"],
    ]
    torch.testing.assert_close(torch.tensor(data["normalised"]), result.normalised.flatten())
    assert data["clean"] == result.clean_baseline and data["corrupted"] == result.corrupted_baseline


def test_nan_scores_travel_as_null(model):
    clean = model.to_tokens("abcabc")
    with pytest.warns(UserWarning, match="same mean metric"):
        tied = activation_patch(
            model, "z", clean_tokens=clean, corrupted_tokens=clean, metric=last_logit_99
        )
    data = embedded(view.patching(tied).html())  # clean == corrupted: normalised is NaN
    assert data["normalised"] == [None] * 8


def test_reprs_stay_text_and_notebooks_get_tables(model):
    _, cache = model.run_with_cache("a<b>")
    decomp = decompose_resid(model, cache, granularity="head")
    scores = induction_scores(model, seq_len=4, batch=2)
    result = _patching(model)
    for thing, needle in [
        (cache, "blocks.1.attn.hook_pattern"),
        (decomp, "L1H3"),
        (scores, "H3"),
        (result, "corrupted"),
    ]:
        table = thing._repr_html_()
        assert table.startswith("<div") and "<table" in table and needle in table
        assert "<script" not in table
        assert not repr(thing).startswith("<")
    assert "(1, 4, 5, 5)" in cache._repr_html_()


def test_notebook_tables_escape_labels(model):
    _, cache = model.run_with_cache("ab")
    renamed = type(cache)({"<img src=x>": cache["embed"]}, cache.n_layers)
    assert "<img" not in renamed._repr_html_() and "&lt;img src=x&gt;" in renamed._repr_html_()


def test_cli_writes_the_attention_page(tmp_path, capsys):
    # A shipped two-layer attention-only model, whatever the registry calls it. In-process
    # (tests/project/test_cli.py runs the CLI in subprocesses): the same parser and command.
    (name,) = [
        info.name
        for info in list_pretrained()
        if info.config.n_layers == 2 and info.config.attn_only
    ]
    out = tmp_path / "attention.html"
    assert cli(["view", name, "abcabc xyzxyz", "-o", str(out), "--head", "L1H3"]) == 0
    assert str(out) in capsys.readouterr().out
    data = embedded(out.read_text(encoding="utf-8"))
    assert "".join(data["tokens"]) == "<bos>abcabc xyzxyz"
    assert data["start"] == {"index": 8 + 3, "grid": False}
    model = HookedTransformer.from_pretrained(name)
    _, cache = model.run_with_cache("abcabc xyzxyz")
    # Run with only the patterns recorded: the same to float32 rounding.
    torch.testing.assert_close(decoded_patterns(data)[1], cache["pattern", 1][0], rtol=0, atol=1e-5)


def test_cli_names_a_head_that_is_not_there(tmp_path, capsys):
    (name,) = [i.name for i in list_pretrained() if i.config.n_layers == 2 and i.config.attn_only]
    assert cli(["view", name, "ab", "-o", str(tmp_path / "a.html"), "--head", "L5H0"]) == 2
    assert "not on this page" in capsys.readouterr().err
