"""The attribution-graph page in a real browser (Debian's headless Chromium, via Playwright):
what it draws is read back from the DOM and checked against the graph JSON it was made
from. Every page is watched for console errors and for requests (none may leave the file).
"""

import itertools
import math

import pytest
import torch
from helpers.browser import NEEDS_A_BROWSER, Opened, launched

from analysis.attribution_graphs import (
    attribution_graph,
    graph_json,
    graph_qk_attribution,
    prune_graph,
)
from hookedattn import ByteTokenizer
from hookedattn.sae import Transcoder, TranscoderConfig
from hookedattn.testing import random_tiny_model
from hookedattn.viewer import graph_page

pytestmark = NEEDS_A_BROWSER


@pytest.fixture(scope="module")
def browser():
    """Chromium, its pages 1400 pixels wide: room for the graph's token columns."""
    with launched(width=1400) as context:
        yield context


@pytest.fixture(scope="module")
def built():
    fields = dict(n_ctx=32, d_vocab=259, act_fn="gelu", dtype=torch.float64)
    model = random_tiny_model(randomize_seed=2, tokenizer=ByteTokenizer(), **fields)
    tcs = []
    for layer in range(2):
        hooks = f"blocks.{layer}.ln2.hook_out", f"blocks.{layer}.hook_mlp_out"
        cfg = TranscoderConfig(16, 48, 16, *hooks, "topk", k=4, skip=True, dtype="float64")
        tcs.append(Transcoder(cfg))
    graph = attribution_graph(model, tcs, "ab <b>c</b>\nab", top_k=2)
    return model, tcs, graph, prune_graph(graph, 0.9, 0.99)


@pytest.fixture(scope="module")
def graph_doc(built):
    _, _, graph, pruned = built
    return graph_json(graph, pruned)


@pytest.fixture(scope="module")
def qk_doc(built):
    """The graph with three scores opened (layer, head, key; the query the last position),
    five terms each: among them terms whose two writers are both drawn."""
    model, tcs, graph, pruned = built
    qk = [graph_qk_attribution(model, tcs, graph, layer, head, key)
          for layer, head, key in ((1, 0, 14), (0, 0, 12), (1, 2, 9))]  # fmt: skip
    return graph_json(graph, pruned, qk=qk, qk_terms=5)


def nodes_drawn(opened: Opened) -> list[dict]:
    return opened.page.eval_on_selector_all(
        "#graph .node",
        """shapes => shapes.map(s => { const b = s.getBoundingClientRect();
            return {id: s.dataset.nodeId, kind: s.dataset.kind, layer: s.dataset.layer,
                    ctx: +s.dataset.ctx, x: b.x + b.width / 2, y: b.y + b.height / 2}; })""",
    )


def test_every_node_sits_in_its_token_column_and_layer_row(browser, graph_doc, tmp_path):
    opened = Opened(browser, graph_page(graph_doc).save(tmp_path / "graph.html"))
    drawn = nodes_drawn(opened)
    assert sorted(n["id"] for n in drawn) == sorted(n["node_id"] for n in graph_doc["nodes"])
    # columns: every node of a later position lies to the right of every node of an earlier one
    by_pos: dict[int, list[float]] = {}
    for n in drawn:
        by_pos.setdefault(n["ctx"], []).append(n["x"])
    positions = sorted(by_pos)
    for a, b in itertools.pairwise(positions):
        assert max(by_pos[a]) < min(by_pos[b])
    # rows: tokens at the bottom, then layer 0, layer 1, and the logits at the top
    row = {"E": 0, "0": 1, "1": 2, "3": 3}
    heights = {}
    for n in drawn:
        heights.setdefault(row[n["layer"]], set()).add(round(n["y"], 3))
    assert all(len(ys) == 1 for ys in heights.values())
    ordered = [heights[r].pop() for r in sorted(heights)]
    assert ordered == sorted(ordered, reverse=True)  # screen y grows downwards
    opened.close("graph.png")


def test_every_link_is_drawn_with_its_weight_and_sign(browser, graph_doc, tmp_path):
    opened = Opened(browser, graph_page(graph_doc).save(tmp_path / "graph.html"))
    links = opened.page.eval_on_selector_all(
        "#graph line.link",
        "ls => ls.map(l => [l.dataset.source, l.dataset.target, +l.dataset.weight, "
        "l.classList.contains('neg')])",
    )
    expected = [
        [k["source"], k["target"], k["weight"], k["weight"] < 0] for k in graph_doc["links"]
    ]
    assert sorted(links) == sorted(expected) and len(links) > 5
    opened.close()


def test_hovering_a_feature_shows_its_top_activations(browser, graph_doc, tmp_path):
    feature = next(n for n in graph_doc["nodes"] if n["feature_type"] == "cross layer transcoder")
    key = f"{feature['layer']}_{feature['node_id'].split('_')[1]}"
    examples = {key: [{"activation": 2.5, "tokens": ["d", "e", "<i>f"], "position": 2},
                      {"activation": 1.25, "tokens": ["x", "y"], "position": 0}]}  # fmt: skip
    opened = Opened(browser, graph_page(graph_doc, examples).save(tmp_path / "graph.html"))
    opened.page.hover(f"#graph .node[data-node-id='{feature['node_id']}']")
    detail = opened.page.locator("#node-detail")
    assert detail.locator("[data-fact=node]").inner_text() == feature["node_id"]
    assert float(detail.locator("[data-fact=activation]").inner_text()) == pytest.approx(
        feature["activation"], rel=1e-3
    )
    shown = opened.page.eval_on_selector_all(
        "#node-detail .example",
        "es => es.map(e => [+e.dataset.activation, e.querySelector('.hit').textContent])",
    )
    assert shown == [[2.5, "<i>f"], [1.25, "x"]]  # markup in a token is text
    assert opened.page.locator("#node-detail i").count() == 0
    opened.close("graph-hover.png")


def test_clicking_a_node_keeps_only_its_links(browser, graph_doc, tmp_path):
    opened = Opened(browser, graph_page(graph_doc).save(tmp_path / "graph.html"))
    logit = next(n for n in graph_doc["nodes"] if n["is_target_logit"])
    opened.page.click(f"#graph .node[data-node-id='{logit['node_id']}']")
    shown = opened.page.eval_on_selector_all(
        "#graph line.link:not(.faded)", "ls => ls.map(l => l.dataset.target)"
    )
    into = [k for k in graph_doc["links"] if logit["node_id"] in (k["source"], k["target"])]
    assert len(shown) == len(into) > 0 and set(shown) == {logit["node_id"]}
    opened.close()


def test_the_prompt_tokens_are_shown_as_text(browser, graph_doc, tmp_path):
    opened = Opened(browser, graph_page(graph_doc).save(tmp_path / "graph.html"))
    labels = opened.page.eval_on_selector_all(
        "#graph .token-label", "ts => ts.map(t => t.textContent)"
    )
    assert "<" in labels and "\u23ce" in labels  # a newline is drawn as ⏎
    assert opened.page.locator("#graph b").count() == 0
    summary = opened.page.locator("#summary").inner_text()
    assert f"{len(graph_doc['nodes'])} nodes, {len(graph_doc['links'])} links" in summary
    opened.close()


def synthetic_graph(n_tokens: int, per_cell: int, n_links: int, seed: int = 0) -> dict:
    """A graph JSON of the size a long unpruned prompt gives: `per_cell` features in each
    (layer, position) of 2 layers, an error node and a token per position, one logit, and
    `n_links` random links between them."""
    g = torch.Generator().manual_seed(seed)
    nodes = [{"node_id": f"E_{p}", "feature": None, "layer": "E", "ctx_idx": p,
              "feature_type": "embedding", "influence": None, "activation": None}
             for p in range(n_tokens)]  # fmt: skip
    for layer in range(2):
        for p in range(n_tokens):
            nodes.append({"node_id": f"{layer}_err_{p}", "feature": None, "layer": str(layer),
                          "ctx_idx": p, "feature_type": "mlp reconstruction error",
                          "influence": 0.5, "activation": None})  # fmt: skip
            for f in range(per_cell):
                nodes.append({"node_id": f"{layer}_{p * per_cell + f}_{p}", "feature": f,
                              "layer": str(layer), "ctx_idx": p,
                              "feature_type": "cross layer transcoder",
                              "influence": float(f) / per_cell, "activation": 1.0})  # fmt: skip
    nodes.append({"node_id": "3_7_last", "feature": 7, "layer": "3", "ctx_idx": n_tokens - 1,
                  "feature_type": "logit", "token_prob": 0.9, "is_target_logit": True,
                  "influence": None, "activation": None})  # fmt: skip
    ids = [n["node_id"] for n in nodes]
    pairs = torch.randint(0, len(ids), (n_links, 2), generator=g).tolist()
    weights = torch.randn(n_links, generator=g).tolist()
    links = [{"source": ids[a], "target": ids[b], "weight": w}
             for (a, b), w in zip(pairs, weights, strict=True)]  # fmt: skip
    metadata = {
        "slug": "synthetic",
        "prompt": "",
        "prompt_tokens": [f"t{p}" for p in range(n_tokens)],
    }
    return {"metadata": metadata, "nodes": nodes, "links": links}


def test_a_graph_of_41_tokens_opens_fitted_with_readable_labels(browser, tmp_path):
    graph = synthetic_graph(41, 6, 3000)
    opened = Opened(browser, graph_page(graph).save(tmp_path / "graph.html"))
    box = opened.page.eval_on_selector("#graph", "s => s.getBoundingClientRect().toJSON()")
    assert box["x"] >= 0 and box["x"] + box["width"] <= 1400  # no horizontal scrolling
    labels = opened.page.eval_on_selector_all(
        "#graph .token-label",
        """ts => ts.map(t => ({size: parseFloat(getComputedStyle(t).fontSize),
                               x: +t.getAttribute('x'), turned: t.hasAttribute('transform'),
                               width: t.getBBox().width}))""",
    )
    assert len(labels) == 41 and all(label["size"] >= 10 for label in labels)
    # Readable: consecutive labels do not overlap. Side by side, each fits its column;
    # turned 60 degrees, their lines lie at least a font size apart.
    step = labels[1]["x"] - labels[0]["x"]
    for label in labels:
        if label["turned"]:
            assert step * math.sin(math.radians(60)) >= label["size"]
        else:
            assert label["width"] <= step
    logit = opened.page.eval_on_selector(
        "#graph .node.logit", "s => s.getBoundingClientRect().toJSON()"
    )
    assert 0 <= logit["x"] <= 1400 and 0 <= logit["y"] <= 900  # in view as it opens
    opened.close("graph-41-tokens.png")


def test_a_graph_of_150000_links_is_drawn(browser, tmp_path):
    graph = synthetic_graph(127, 8, 150_000)
    opened = Opened(browser, graph_page(graph).save(tmp_path / "graph.html"))
    drawn = opened.page.eval_on_selector_all("#graph line.link", "ls => ls.length")
    assert drawn == 150_000
    summary = opened.page.locator("#summary").inner_text()
    assert f"{len(graph['nodes'])} nodes, 150000 links" in summary
    opened.close()


# ---------------------------------------------------------------------- the QK section
def marked(opened: Opened) -> dict[str, list[str]]:
    """The ids of the nodes marked as a term's query writer and as its key writer."""
    return {
        side: opened.page.eval_on_selector_all(
            f"#graph .node.qk-{side}", "ss => ss.map(s => s.dataset.nodeId)"
        )
        for side in ("query", "key")
    }


def a_term_of_two_drawn_nodes(doc: dict) -> tuple[int, int, dict]:
    """(panel, row, term) of the first term whose query and key writers are distinct nodes."""
    return next(
        (i, j, term)
        for i, entry in enumerate(doc["qk_attributions"])
        for j, term in enumerate(entry["terms"])
        if term["query_node"] and term["key_node"] and term["query_node"] != term["key_node"]
    )


def test_the_qk_section_lists_each_scores_terms_the_rest_and_the_score(browser, qk_doc, tmp_path):
    opened = Opened(browser, graph_page(qk_doc).save(tmp_path / "graph.html"))
    panels = opened.page.eval_on_selector_all(
        "#qk .qk-head",
        """ps => ps.map(p => ({layer: +p.dataset.layer, head: +p.dataset.head,
            terms: [...p.querySelectorAll('tr.qk-term')].map(r => [
                r.cells[0].firstChild.textContent, r.cells[1].firstChild.textContent,
                +r.dataset.value]),
            rest: +p.querySelector('tr.qk-rest').dataset.value,
            score: +p.querySelector('tr.qk-score').dataset.value}))""",
    )
    expected = [
        {"layer": e["layer"], "head": e["head"],
         "terms": [[t["query_label"], t["key_label"], t["value"]] for t in e["terms"]],
         "rest": e["rest"], "score": e["score"]}
        for e in qk_doc["qk_attributions"]
    ]  # fmt: skip
    assert panels == expected and [len(p["terms"]) for p in panels] == [5, 5, 5]
    opened.close("graph-qk.png")


def test_hovering_a_term_marks_its_query_and_key_writers_nodes(browser, qk_doc, tmp_path):
    opened = Opened(browser, graph_page(qk_doc).save(tmp_path / "graph.html"))
    panel, row, term = a_term_of_two_drawn_nodes(qk_doc)
    assert marked(opened) == {"query": [], "key": []}
    opened.page.hover(f"#qk .qk-head >> nth={panel} >> tr.qk-term >> nth={row}")
    assert marked(opened) == {"query": [term["query_node"]], "key": [term["key_node"]]}
    opened.close()


def test_leaving_a_term_unmarks_its_nodes(browser, qk_doc, tmp_path):
    opened = Opened(browser, graph_page(qk_doc).save(tmp_path / "graph.html"))
    panel, row, _ = a_term_of_two_drawn_nodes(qk_doc)
    opened.page.hover(f"#qk .qk-head >> nth={panel} >> tr.qk-term >> nth={row}")
    opened.page.hover("#summary")
    assert marked(opened) == {"query": [], "key": []}
    opened.close()


def test_clicking_a_term_keeps_its_nodes_marked_until_clicked_again(browser, qk_doc, tmp_path):
    opened = Opened(browser, graph_page(qk_doc).save(tmp_path / "graph.html"))
    panel, row, term = a_term_of_two_drawn_nodes(qk_doc)
    selector = f"#qk .qk-head >> nth={panel} >> tr.qk-term >> nth={row}"
    opened.page.click(selector)
    opened.page.hover("#qk .qk-head >> nth=0 >> tr.qk-term >> nth=0")  # another term
    assert marked(opened) == {"query": [term["query_node"]], "key": [term["key_node"]]}
    opened.page.click(selector)
    opened.page.hover("#summary")
    assert marked(opened) == {"query": [], "key": []}
    opened.close()


def test_a_writer_that_is_not_drawn_is_shown_as_such(browser, qk_doc, tmp_path):
    opened = Opened(browser, graph_page(qk_doc).save(tmp_path / "graph.html"))
    off = opened.page.eval_on_selector_all(
        "#qk td.writer.off-graph", "cs => cs.map(c => c.textContent)"
    )
    expected = [
        term[f"{side}_label"]
        for entry in qk_doc["qk_attributions"]
        for term in entry["terms"]
        for side in ("query", "key")
        if term[f"{side}_node"] is None
    ]
    assert off == expected and len(off) > 0
    opened.close()


def test_a_graph_without_qk_attributions_has_no_qk_section(browser, graph_doc, tmp_path):
    opened = Opened(browser, graph_page(graph_doc).save(tmp_path / "graph.html"))
    assert opened.page.locator("#qk").count() == 0
    assert opened.page.locator(".qk-head, .qk-terms").count() == 0
    opened.close()
