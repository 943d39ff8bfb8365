"""The viewer's pages in a real browser: Debian's headless Chromium, driven by Playwright.

Each test saves a page, opens it from a file:// URL and reads back from the DOM what the
page shows, against the cache or result it was made from. Every page is watched for
console errors and for requests (all intercepted; none may leave the file). Screenshots
are kept in reports/tests/viewer/ (ignored by git) as the tests' artefacts (see
tests/helpers/browser.py).
"""

import pytest
import torch
from helpers.browser import NEEDS_A_BROWSER, Opened, browser, saved

from analysis import activation_patch, decompose_resid, direct_logit_attribution, view
from hookedattn import ByteTokenizer
from hookedattn.testing import random_tiny_model
from hookedattn.viewer import attention

pytestmark = NEEDS_A_BROWSER
__all__ = ["browser"]  # the fixture, from tests/helpers/browser.py


def last_logit_99(logits):
    return logits[:, -1, 99]


@pytest.fixture(scope="module")
def model():
    fields = dict(n_ctx=96, d_vocab=259, attn_only=True, dtype=torch.float32)
    return random_tiny_model(randomize_seed=3, tokenizer=ByteTokenizer(), **fields).eval()


def grid(cells: list, shape: tuple[int, int]) -> torch.Tensor:
    values = torch.full(shape, float("nan"), dtype=torch.float64)
    for row, col, value in cells:
        values[row, col] = float(value)
    return values


def test_the_request_watch_sees_a_request(browser, tmp_path):
    # Without this, "no requests" below could mean that nothing was being watched.
    path = tmp_path / "fetches.html"
    path.write_text(
        '<img src="http://127.0.0.1:9/x.png"><script>document.body.dataset.ready = "true"</script>'
    )
    opened = Opened(browser, path)
    assert opened.requests == ["http://127.0.0.1:9/x.png"]
    opened.page.close()


def test_heatmap_cells_are_the_caches_pattern_for_each_head(browser, model, tmp_path):
    prompt = "abcabc xyzxyz"
    _, cache = model.run_with_cache(prompt)
    n = len(model.to_str_tokens(prompt))
    opened = Opened(browser, saved(attention(model, cache), tmp_path, "attention.html"))
    page = opened.page
    shown = grid(opened.cells("pattern"), (n, n))
    torch.testing.assert_close(shown, cache["pattern", 0][0, 0].double(), rtol=0, atol=1e-6)
    ticks = page.eval_on_selector_all("#pattern .row-tick", "ts => ts.map(t => t.textContent)")
    assert ticks == [t.replace(" ", "\u00a0") for t in model.to_str_tokens(prompt)]
    page.select_option("#layer", "1")
    page.select_option("#head", "2")
    assert page.get_attribute("body", "data-head") == "L1H2"
    shown = grid(opened.cells("pattern"), (n, n))
    torch.testing.assert_close(shown, cache["pattern", 1][0, 2].double(), rtol=0, atol=1e-6)
    page.hover('#pattern rect[data-row="5"][data-col="2"]')
    tip = page.text_content("#tip")
    assert tip.startswith("L1H2  query 5 ") and "key 2" in tip
    assert abs(float(tip.rsplit(": ", 1)[1]) - float(cache["pattern", 1][0, 2, 5, 2])) < 1e-6
    opened.close(screenshot="attention.png")


def test_hovering_a_token_colours_every_token_by_its_attention(browser, model, tmp_path):
    prompt = "the cat sat"
    _, cache = model.run_with_cache(prompt)
    pattern = cache["pattern", 1][0, 3].double()
    opened = Opened(browser, saved(attention(model, cache, head="L1H3"), tmp_path, "a.html"))
    page = opened.page
    weights = 'ts => ts.map(t => t.hasAttribute("data-weight") ? +t.dataset.weight : null)'
    page.hover('.token[data-pos="7"]')  # as a query: the attention it pays
    paid = page.eval_on_selector_all("#tokens .token", weights)
    torch.testing.assert_close(
        torch.tensor(paid, dtype=torch.float64), pattern[7], atol=1e-6, rtol=0
    )
    assert '7 "t" pays most to' in page.text_content("#info")
    page.select_option("#mode", "key")
    page.hover('.token[data-pos="2"]')  # as a key: the attention it receives
    received = page.eval_on_selector_all("#tokens .token", weights)
    torch.testing.assert_close(
        torch.tensor(received, dtype=torch.float64), pattern[:, 2], atol=1e-6, rtol=0
    )
    page.click('.token[data-pos="4"]')  # a click keeps the token after the mouse leaves
    page.hover("h1")
    kept = page.eval_on_selector_all("#tokens .token", weights)
    torch.testing.assert_close(
        torch.tensor(kept, dtype=torch.float64), pattern[:, 4], atol=1e-6, rtol=0
    )
    page.click('.token[data-pos="4"]')
    page.hover("h1")
    assert page.eval_on_selector_all("#tokens .token", weights) == [None] * 12
    opened.close()


def test_all_heads_as_small_multiples_and_back_to_one(browser, model, tmp_path):
    _, cache = model.run_with_cache("abab")
    opened = Opened(browser, saved(attention(model, cache, head="all"), tmp_path, "a.html"))
    page = opened.page
    assert page.is_visible("#grid") and not page.is_visible("#pattern")
    labels = page.eval_on_selector_all("#grid figcaption", "fs => fs.map(f => f.textContent)")
    assert labels == [f"L{layer}H{head}" for layer in range(2) for head in range(4)]
    page.click('.thumb[data-head="L1H1"]')
    assert page.is_visible("#pattern") and not page.is_visible("#grid")
    assert page.input_value("#layer") == "1" and page.input_value("#head") == "1"
    shown = grid(opened.cells("pattern"), (5, 5))
    torch.testing.assert_close(shown, cache["pattern", 1][0, 1].double(), rtol=0, atol=1e-6)
    opened.close(screenshot="attention-all-heads.png")


def test_a_script_in_the_prompt_is_shown_as_text_and_never_run(browser, model, tmp_path):
    prompt = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
    opened = Opened(browser, saved(attention(model, prompt, title=prompt), tmp_path, "s.html"))
    page = opened.page
    shown = page.eval_on_selector_all("#tokens .token", "ts => ts.map(t => t.textContent)")
    assert "".join(shown) == "<bos>" + prompt.replace(" ", "\u00a0")
    assert page.text_content("h1") == prompt and page.title() == prompt
    assert page.evaluate("window.pwned") is None
    assert page.locator("main img").count() == 0 and page.locator("main script").count() == 0
    opened.close(screenshot="script-prompt.png")


def test_attribution_bars_sort_and_follow_the_clicked_token(browser, model, tmp_path):
    tokens = model.to_tokens("abcabc")
    _, cache = model.run_with_cache(tokens)
    dla = direct_logit_attribution(
        model, cache, decompose_resid(model, cache, granularity="head"), tokens
    )
    opened = Opened(browser, saved(view.logit_attribution(model, cache, dla), tmp_path, "d.html"))
    page = opened.page
    rows = "rs => rs.map(r => [r.dataset.label, +r.dataset.value])"
    shown = page.eval_on_selector_all("#bars .bar-track", rows)
    assert [label for label, _ in shown] == list(dla.labels)  # model order, last token
    torch.testing.assert_close(
        torch.tensor([v for _, v in shown], dtype=torch.float64),
        dla.contributions[:, 0, -1].double(),
    )
    page.select_option("#sort", "value")
    values = [v for _, v in page.eval_on_selector_all("#bars .bar-track", rows)]
    assert values == sorted(values, reverse=True)
    page.select_option("#sort", "abs")
    values = [abs(v) for _, v in page.eval_on_selector_all("#bars .bar-track", rows)]
    assert values == sorted(values, reverse=True)
    page.click('.token[data-pos="2"]')
    at_two = dict(page.eval_on_selector_all("#bars .bar-track", rows))
    assert at_two["L1H3"] == pytest.approx(float(dla["L1H3"][0, 2]), abs=1e-6)
    assert 'position 2 "b"' in page.text_content("#info")
    opened.close(screenshot="logit-attribution.png")


def test_patching_heatmap_with_hover_values_and_baselines(browser, model, tmp_path):
    clean, corrupted = model.to_tokens("abcabc"), model.to_tokens("abcxbc")
    result = activation_patch(
        model, "z", clean_tokens=clean, corrupted_tokens=corrupted, metric=last_logit_99
    )
    opened = Opened(browser, saved(view.patching(result), tmp_path, "p.html"))
    page = opened.page
    shown = grid(opened.cells("patching"), (2, 4))
    torch.testing.assert_close(shown, result.normalised.double(), rtol=0, atol=1e-6)
    page.select_option("#quantity", "values")
    shown = grid(opened.cells("patching"), (2, 4))
    torch.testing.assert_close(shown, result.values.double(), rtol=0, atol=1e-6)
    page.hover('#patching rect[data-row="1"][data-col="3"]')
    tip = page.text_content("#tip").splitlines()
    assert tip[0] == result.label((1, 3))
    assert float(tip[1].split()[-1]) == pytest.approx(float(result.normalised[1, 3]), abs=1e-6)
    clean_shown = page.text_content('[data-fact="clean baseline"]')
    assert float(clean_shown) == pytest.approx(result.clean_baseline, abs=1e-6)
    corrupted_shown = page.text_content('[data-fact="corrupted baseline"]')
    assert float(corrupted_shown) == pytest.approx(result.corrupted_baseline, abs=1e-6)
    opened.close(screenshot="patching.png")


def test_the_notebook_frame_shows_the_same_page(browser, model, tmp_path):
    # What Jupyter does with _repr_html_: put the markup into its own page.
    page = attention(model, "a<b>c", head="L0H1")
    path = tmp_path / "notebook.html"
    path.write_text(f"<!DOCTYPE html><html><body>{page._repr_html_()}</body></html>")
    opened = Opened(browser, path, ready=False)
    frame = opened.page.frame_locator("iframe")
    frame.locator("body[data-ready=true]").wait_for(timeout=10_000)
    assert frame.locator("body").get_attribute("data-head") == "L0H1"
    shown = frame.locator("#tokens .token").all_text_contents()
    assert shown == ["<bos>", "a", "<", "b", ">", "c"]
    opened.close()


def test_whitespace_and_control_characters_are_made_visible(browser, model, tmp_path):
    page = attention(model, "a\x1d\tb\nc")
    opened = Opened(browser, saved(page, tmp_path, "w.html"))
    shown = opened.page.eval_on_selector_all("#tokens .token", "ts => ts.map(t => t.textContent)")
    assert shown == ["<bos>", "a", "\\x1d", "\u21e5", "b", "\u23ce", "c"]
    assert opened.page.text_content("h1") == "attention: \u201c<bos>a\\x1d\\tb\\nc\u201d"
    opened.close()
