/* hookedattn viewer: the attribution-graph page. Draws the graph JSON (circuit-tracer's and
 * Neuronpedia's format) embedded in this page as data.graph, and each feature's top
 * activations (data.examples, keyed "layer_feature") on hover. No library, nothing fetched;
 * every string from the data reaches the page through textContent or an attribute.
 *
 * Layout: one column per prompt position (token labels below), one row per layer from the
 * embeddings at the bottom to the logits at the top, fitted to the window; the nodes of a
 * (layer, position) cell sit side by side in it, most influential first. Links are lines,
 * blue for a positive
 * direct effect and red for a negative one, width and opacity by |weight|. Hovering a node
 * shows what it is (and a feature's examples); clicking one keeps it and shows only its
 * links.
 *
 * Attention scores opened in the graph's terms (data.graph.qk_attributions, written by
 * analysis.attribution_graphs.graph_json; absent from circuit-tracer's graphs, and then
 * nothing is drawn for them) come below the graph: one table a score, its largest
 * query-writer x key-writer terms, the sum of the rest and the score they add up to.
 * Hovering a term marks its two writers' nodes on the graph; clicking keeps them marked.
 */
(function () {
  "use strict";

  const SVG = "http://www.w3.org/2000/svg";
  function make(ns, tag, attrs, text) {
    const node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }
  const el = (tag, attrs, text) => make(null, tag, attrs, text);
  const svg = (tag, attrs, text) => make(SVG, tag, attrs, text);
  const short = (v) => (v === null || v === undefined ? "-" : String(Number(Number(v).toPrecision(4))));
  function visible(token) {
    const escape = (c) => "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0");
    const text = String(token).replace(/ /g, "\u00a0").replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5")
      .replace(/[\u0000-\u001f\u007f]/g, escape);
    return text === "" ? "\u2205" : text;
  }

  const KIND_ROW = { embedding: "E", logit: "logit" };
  const LABEL = { "cross layer transcoder": "feature", "mlp reconstruction error": "error", embedding: "token", logit: "logit" };

  function graphView(root, d) {
    const g = d.graph;
    const meta = g.metadata;
    const tokens = meta.prompt_tokens;
    const layers = [...new Set(g.nodes.filter((n) => !(n.feature_type in KIND_ROW)).map((n) => Number(n.layer)))].sort((a, b) => a - b);
    const rows = ["E", ...layers.map(String), "logit"];
    const rowOf = (n) => rows.length - 1 - rows.indexOf(KIND_ROW[n.feature_type] || String(n.layer));

    // Cells: nodes of one (row, position), most influential first (logits by probability).
    const cells = new Map();
    for (const n of g.nodes) {
      const key = `${rowOf(n)}:${n.ctx_idx}`;
      if (!cells.has(key)) cells.set(key, []);
      cells.get(key).push(n);
    }
    const rank = (n) => (n.feature_type === "logit" ? -n.token_prob : (n.influence === null ? 2 : n.influence));
    for (const list of cells.values()) list.sort((a, b) => rank(a) - rank(b));
    // Sizes by reduction, never by spreading an array into arguments: a graph of 10^5 links
    // would exceed the call stack.
    const largest = (values, floor) => values.reduce((m, v) => (v > m ? v : m), floor);
    const widest = largest([...cells.values()].map((l) => l.length), 1);
    // Fitted to the window: every column as wide as its nodes want, unless the prompt would
    // not fit; then as narrow as the window needs, down to a width its label can still be
    // read at (turned, below). A prompt too long even then scrolls, opened at its end,
    // where the logits are.
    const left = 56, top = 18, rowHeight = 76;
    const room = Math.max(480, (document.documentElement.clientWidth || 1200) - 330) - left - 16;
    const wanted = Math.max(28, Math.min(120, 10 * widest + 12));
    const colWidth = Math.max(18, Math.min(wanted, room / Math.max(1, tokens.length)));
    const turned = colWidth < 40;  // labels turned 60 degrees where a column is narrow
    const labelRoom = turned ? 64 : 24;
    const width = left + colWidth * tokens.length + 16;
    const height = top + rowHeight * rows.length + labelRoom + 16;
    const where = new Map();
    for (const [key, list] of cells) {
      const [row, pos] = key.split(":").map(Number);
      const step = Math.min(10, (colWidth - 6) / Math.max(1, list.length));
      list.forEach((n, i) => {
        where.set(n.node_id, { x: left + colWidth * pos + colWidth / 2 + (i - (list.length - 1) / 2) * step, y: top + rowHeight * row + rowHeight / 2 });
      });
    }

    const root_svg = svg("svg", { id: "graph", width: width, height: height, class: "graph" });
    rows.forEach((name, i) => {
      const y = top + rowHeight * (rows.length - 1 - i) + rowHeight / 2;
      root_svg.append(svg("text", { x: 4, y: y + 3, class: "row-label" }, name === "E" ? "tokens" : name === "logit" ? "logits" : `L${name}`));
      root_svg.append(svg("line", { x1: left, x2: width - 8, y1: y, y2: y, class: "row-line" }));
    });
    const labelY = top + rowHeight * rows.length + 12;
    tokens.forEach((t, p) => {
      const x = left + colWidth * p + colWidth / 2;
      const attrs = { x: x, y: labelY, class: "token-label", "text-anchor": turned ? "end" : "middle", "data-pos": p };
      if (turned) attrs.transform = `rotate(-60 ${x} ${labelY})`;
      root_svg.append(svg("text", attrs, visible(t)));
    });

    const maxWeight = largest(g.links.map((l) => Math.abs(l.weight)), 1e-30);
    const linkLayer = svg("g", { class: "links" });
    const links = g.links.filter((l) => where.has(l.source) && where.has(l.target)).map((l) => {
      const a = where.get(l.source), b = where.get(l.target), share = Math.abs(l.weight) / maxWeight;
      const line = svg("line", {
        x1: a.x, y1: a.y, x2: b.x, y2: b.y, class: "link " + (l.weight < 0 ? "neg" : "pos"),
        "stroke-width": (0.4 + 3 * share).toFixed(2), "stroke-opacity": (0.15 + 0.75 * share).toFixed(3),
        "data-source": l.source, "data-target": l.target, "data-weight": String(l.weight),
      });
      linkLayer.append(line);
      return line;
    });
    root_svg.append(linkLayer);

    const detail = el("div", { id: "node-detail", class: "detail" });
    const nodeLayer = svg("g", { class: "nodes" });
    let kept = null;
    for (const n of g.nodes) {
      const p = where.get(n.node_id);
      const kind = LABEL[n.feature_type] || "node";
      const attrs = { class: `node ${kind}`, "data-node-id": n.node_id, "data-layer": n.layer, "data-ctx": n.ctx_idx, "data-kind": kind };
      const shape = kind === "error" ? svg("rect", { ...attrs, x: p.x - 4, y: p.y - 4, width: 8, height: 8 })
        : kind === "logit" ? svg("rect", { ...attrs, x: p.x - 5, y: p.y - 5, width: 10, height: 10, transform: `rotate(45 ${p.x} ${p.y})` })
          : svg("circle", { ...attrs, cx: p.x, cy: p.y, r: kind === "token" ? 5 : 4.5 });
      shape.addEventListener("mouseenter", () => { if (!kept) show(n); });
      shape.addEventListener("click", () => { kept = kept === n ? null : n; show(n); focus(kept); });
      nodeLayer.append(shape);
    }
    root_svg.append(nodeLayer);

    function focus(n) {
      for (const line of links) {
        const touches = !n || line.dataset.source === n.node_id || line.dataset.target === n.node_id;
        line.classList.toggle("faded", !touches);
      }
      for (const shape of nodeLayer.children) shape.classList.toggle("selected", !!n && shape.dataset.nodeId === n.node_id);
    }

    function show(n) {
      const kind = LABEL[n.feature_type] || n.feature_type;
      const facts = [["node", n.node_id], ["kind", kind], ["layer", n.layer], ["position", `${n.ctx_idx} ${JSON.stringify(tokens[n.ctx_idx] ?? "")}`]];
      if (n.activation !== null && n.activation !== undefined) facts.push(["activation", short(n.activation)]);
      if (n.influence !== null && n.influence !== undefined) facts.push(["cumulative influence", short(n.influence)]);
      if (kind === "logit") facts.push(["probability", short(n.token_prob)]);
      if (n.clerp) facts.push(["label", n.clerp]);
      const incoming = g.links.filter((l) => l.target === n.node_id).length;
      const outgoing = g.links.filter((l) => l.source === n.node_id).length;
      facts.push(["links", `${incoming} in, ${outgoing} out`]);
      const list = el("dl", {});
      for (const [term, value] of facts) list.append(el("dt", {}, term), el("dd", { "data-fact": term }, value));
      detail.replaceChildren(el("h2", {}, kind === "feature" ? `feature ${n.node_id.split("_")[1]} of layer ${n.layer}` : kind), list);
      if (kind === "feature") detail.append(examplesOf(n));
    }

    function examplesOf(n) {
      const key = `${n.layer}_${n.node_id.split("_")[1]}`;
      const box = el("div", { class: "examples", "data-feature": key });
      const found = (d.examples || {})[key];
      if (!found || !found.length) {
        box.append(el("p", { class: "muted" }, "no top activations given for this feature"));
        return box;
      }
      box.append(el("h3", {}, "top activations"));
      for (const ex of found) {
        const line = el("div", { class: "example", "data-activation": String(ex.activation) });
        line.append(el("span", { class: "value" }, short(ex.activation) + " "));
        ex.tokens.forEach((t, i) => line.append(el("span", { class: i === ex.position ? "tok hit" : "tok" }, visible(t))));
        box.append(line);
      }
      return box;
    }

    const info = meta.hookedattn || {};
    const summary = [`${g.nodes.length} nodes, ${g.links.length} links`];
    if (info.fraction_explained !== undefined) summary.push(`${(100 * info.fraction_explained).toFixed(1)}% of the influence kept`);
    if (info.error_fraction !== undefined) summary.push(`${(100 * info.error_fraction).toFixed(1)}% of it through error nodes`);
    const views = el("div", { class: "views" });
    const scroller = el("div", { class: "graph-scroll" });
    scroller.append(root_svg);
    views.append(scroller, detail);
    root.append(el("h1", {}, d.title), el("div", { class: "info", id: "summary" }, summary.join("; ")), views);
    if (Array.isArray(g.qk_attributions) && g.qk_attributions.length) {
      const shapeOf = new Map([...nodeLayer.children].map((s) => [s.dataset.nodeId, s]));
      root.append(qkView(g, shapeOf));
    }
    detail.append(el("p", { class: "muted" }, "hover a node; click to keep it and show only its links"));
    scroller.scrollLeft = scroller.scrollWidth;  // the logits' end in view
  }

  // One score's writers, by side: the class a node takes while a term of it is marked.
  const SIDES = [["query", "qk-query"], ["key", "qk-key"]];

  function qkView(g, shapeOf) {
    const tokens = g.metadata.prompt_tokens;
    const byId = new Map(g.nodes.map((n) => [n.node_id, n]));
    const section = el("section", { id: "qk", class: "qk" });
    section.append(
      el("h2", {}, "why the heads attended there: each score as query-side \u00d7 key-side writer terms"),
      el("p", { class: "muted" }, "hover a term to mark its query writer (pink) and key writer (green) on the graph; click to keep them marked"),
    );
    const heads = el("div", { class: "qk-heads" });
    section.append(heads);
    let pinned = null;  // the row whose writers stay marked
    function mark(row) {
      for (const [side, cls] of SIDES) {
        for (const shape of shapeOf.values()) shape.classList.remove(cls);
        const id = row && row.dataset[`${side}Node`];
        if (id && shapeOf.has(id)) shapeOf.get(id).classList.add(cls);
      }
    }
    function writer(side, label, id) {
      const node = id ? byId.get(id) : undefined;
      const cell = el("td", { class: `writer ${side}` + (node ? "" : " off-graph") }, label);
      if (node && node.clerp) cell.append(el("span", { class: "muted" }, ` ${node.clerp}`));
      if (!node) cell.title = "not drawn: not a node of the graph (a head, a bias, a skip term) or pruned away";
      return cell;
    }
    for (const a of g.qk_attributions) {
      const panel = el("div", { class: "qk-head", "data-layer": a.layer, "data-head": a.head, "data-query": a.query_pos, "data-key": a.key_pos });
      const at = (p) => `${p} ${JSON.stringify(tokens[p] ?? "")}`;
      const cap = a.capped_score === null || a.capped_score === undefined ? "" : ` before the soft cap (${short(a.capped_score)} after)`;
      panel.append(
        el("h3", {}, `L${a.layer}H${a.head}: query ${at(a.query_pos)} \u2192 key ${at(a.key_pos)}`),
        el("p", { class: "info" }, `score ${short(a.score)}${cap}: the ${a.terms.length} largest of ${a.n_terms} terms, and the rest`),
      );
      const table = el("table", { class: "qk-terms" });
      const head = el("tr", {});
      for (const name of ["query writer", "key writer", "term"]) head.append(el("th", {}, name));
      table.append(el("thead", {}, undefined), el("tbody", {}, undefined));
      table.tHead.append(head);
      for (const t of a.terms) {
        const row = el("tr", { class: "qk-term", "data-value": String(t.value) });
        if (t.query_node) row.dataset.queryNode = t.query_node;
        if (t.key_node) row.dataset.keyNode = t.key_node;
        row.append(writer("query", t.query_label, t.query_node), writer("key", t.key_label, t.key_node), el("td", { class: "value" }, short(t.value)));
        row.addEventListener("mouseenter", () => { if (!pinned) mark(row); });
        row.addEventListener("mouseleave", () => { if (!pinned) mark(null); });
        row.addEventListener("click", () => {
          if (pinned) pinned.classList.remove("pinned");
          pinned = pinned === row ? null : row;
          if (pinned) pinned.classList.add("pinned");
          mark(pinned || row);
        });
        table.tBodies[0].append(row);
      }
      const rest = el("tr", { class: "qk-rest", "data-value": String(a.rest) });
      rest.append(el("td", { colspan: 2 }, `the other ${a.rest_terms} terms`), el("td", { class: "value" }, short(a.rest)));
      const total = el("tr", { class: "qk-score", "data-value": String(a.score) });
      total.append(el("td", { colspan: 2 }, "score (the sum)"), el("td", { class: "value" }, short(a.score)));
      table.tBodies[0].append(rest, total);
      panel.append(table);
      heads.append(panel);
    }
    return section;
  }

  const data = JSON.parse(document.getElementById("hookedattn-data").textContent);
  const root = document.getElementById("hookedattn-root");
  root.replaceChildren();
  if (data.kind !== "attribution_graph") throw new Error(`the graph page draws attribution graphs, not ${JSON.stringify(data.kind)}`);
  graphView(root, data);
  document.body.dataset.ready = "true";
})();
