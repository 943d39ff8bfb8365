"""The circuit page in a real browser (Debian's headless Chromium, via Playwright), read
back from the DOM against the scores it was made from; no console error, no request."""

import pytest
import torch
from helpers.browser import NEEDS_A_BROWSER, Opened, browser, saved
from helpers.families import TOKENS

from analysis import Circuit, edge_attribution, edge_patching, view
from hookedattn.testing import random_tiny_model

pytestmark = NEEDS_A_BROWSER
__all__ = ["browser"]  # the fixture, from tests/helpers/browser.py

CORRUPTED = torch.randint(0, 23, TOKENS.shape, generator=torch.Generator().manual_seed(7))


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3] - logits[:, -1, 5]


@pytest.fixture(scope="module")
def scored():
    model = random_tiny_model(d_vocab=23)
    prompts = dict(clean_tokens=TOKENS, corrupted_tokens=CORRUPTED, metric=metric)
    return edge_attribution(model, **prompts), edge_patching(model, **prompts)


def drawn(opened) -> list[tuple[str, float]]:
    return opened.page.eval_on_selector_all(
        "#circuit path.edge", "ps => ps.map(p => [p.dataset.label, +p.dataset.score])"
    )


def test_the_circuits_edges_are_drawn_with_their_scores(browser, scored, tmp_path):
    eap, exact = scored
    circuit = Circuit.top(eap, 6)
    opened = Opened(
        browser, saved(view.circuit(eap, circuit=circuit, exact=exact), tmp_path, "c.html")
    )
    shown = dict(drawn(opened))
    assert set(shown) == set(circuit.labels)
    for label, score in shown.items():
        assert score == pytest.approx(eap[label], abs=1e-9)
    listed = opened.page.eval_on_selector_all("#edge-list li", "ls => ls.map(l => l.dataset.label)")
    assert listed == [eap.labels[i] for i in eap.order()[:6]]  # by |score|
    opened.close(screenshot="circuit.png")


def test_clicking_an_edge_shows_its_exact_patching_effect(browser, scored, tmp_path):
    eap, exact = scored
    opened = Opened(browser, saved(view.circuit(eap, exact=exact, top=10), tmp_path, "c.html"))
    page = opened.page
    label = eap.labels[eap.order()[3]]
    page.click(f'#edge-list li[data-label="{label}"]')
    assert page.get_attribute("body", "data-edge") == label
    shown = float(page.text_content('#edge-info [data-fact="exact patching effect"]'))
    assert shown == pytest.approx(exact[label], abs=1e-6)
    assert page.text_content('#edge-info [data-fact="edge"]') == label
    other = eap.labels[eap.order()[0]]
    page.dispatch_event(f'#circuit path[data-label="{other}"]', "click")  # the curve itself
    shown = float(page.text_content('#edge-info [data-fact="exact patching effect"]'))
    assert shown == pytest.approx(exact[other], abs=1e-6)
    assert page.get_attribute(f'#circuit path[data-label="{other}"]', "class") == "edge selected"
    opened.close()


def test_the_chooser_shows_the_top_edges_or_all(browser, scored, tmp_path):
    eap, _ = scored
    opened = Opened(browser, saved(view.circuit(eap, top=10), tmp_path, "c.html"))
    page = opened.page
    assert {label for label, _ in drawn(opened)} == {eap.labels[i] for i in eap.order()[:10]}
    page.select_option("#show", "all")
    assert len(drawn(opened)) == len(eap) and page.get_attribute("body", "data-shown") == str(
        len(eap)
    )
    page.select_option("#show", "top-30")
    assert len(drawn(opened)) == 30
    assert page.text_content('#edge-info [data-fact="exact patching effect"]') == "not computed"
    clean = float(page.text_content('[data-fact="clean baseline"]'))
    assert clean == pytest.approx(eap.clean_baseline, abs=1e-6)
    opened.close(screenshot="circuit-top.png")


def test_an_edge_never_passes_through_a_box_it_does_not_join(browser, scored, tmp_path):
    eap, _ = scored
    opened = Opened(browser, saved(view.circuit(eap, top=len(eap)), tmp_path, "c.html"))
    opened.page.select_option("#show", "all")
    crossings = opened.page.evaluate(
        """() => {
        const boxes = [...document.querySelectorAll('#circuit g.node')].map(g => ({
            label: g.dataset.label, r: g.querySelector('rect').getBBox()}));
        const out = [];
        for (const p of document.querySelectorAll('#circuit path.edge')) {
            const [from, to] = p.dataset.label.split(' -> ');
            const ends = [from, to.split('.')[0]];
            const n = p.getTotalLength();
            for (let s = 0; s <= n; s += 2) {
                const q = p.getPointAtLength(s);
                for (const b of boxes) {
                    if (ends.includes(b.label)) continue;
                    const inX = q.x > b.r.x && q.x < b.r.x + b.r.width;
                    if (inX && q.y > b.r.y && q.y < b.r.y + b.r.height)
                        out.push(`${p.dataset.label} through ${b.label}`);
                }
            }
        }
        return [...new Set(out)];
    }"""
    )
    assert crossings == []
    opened.close(screenshot="circuit-all.png")
