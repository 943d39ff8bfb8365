/* hookedattn viewer, circuit view: a model's components as rows of boxes (the forward's
 * order, top to bottom) and the edges between them as curves, width by |score|, blue for
 * a positive score and red for a negative one. Clicking an edge (or its row in the list)
 * shows its score and its exact patching effect. Registers itself for viewer.js, which
 * passes the drawing helpers (kit). Every string reaches the page as text.
 */
(function () {
  "use strict";

  const BOX_W = 56, BOX_H = 22, COL = 68, ROW = 74, PAD = 28;
  const PORT_X = { q: -17, k: 0, v: 17, "": 0 };

  function circuitView(root, d, kit) {
    const { el, svg, showTip, hideTip, exact, short, select, labelled } = kit;
    const byMagnitude = d.edges.map((_, i) => i)
      .sort((a, b) => Math.abs(d.edges[b].score ?? 0) - Math.abs(d.edges[a].score ?? 0) || a - b);
    const inCircuit = d.edges.some((e) => e.in_circuit);
    const choices = [];
    if (inCircuit) choices.push(["circuit", `the circuit (${d.edges.filter((e) => e.in_circuit).length} edges)`]);
    for (const k of [10, 30, 100]) if (k < d.edges.length) choices.push([`top-${k}`, `top ${k} by |score|`]);
    choices.push(["all", `all ${d.edges.length} edges`]);
    const state = { show: inCircuit ? "circuit" : (choices.find((c) => c[0] === `top-${d.top}`) || choices[0])[0], selected: null };

    // ---- layout: rows of boxes, centred
    const rows = [];
    d.nodes.forEach((node, i) => { (rows[node.row] = rows[node.row] || []).push(i); });
    const widest = rows.reduce((m, r) => Math.max(m, r ? r.length : 0), 0);
    const width = 2 * PAD + widest * COL, height = 2 * PAD + (rows.length - 1) * ROW + BOX_H;
    const at = d.nodes.map(() => null);
    rows.forEach((members, row) => {
      if (!members) return;
      const offset = PAD + (widest - members.length) * COL / 2 + COL / 2;
      members.forEach((n, j) => { at[n] = { x: offset + j * COL, y: PAD + row * ROW + BOX_H / 2 }; });
    });
    const ports = d.nodes.map(() => new Set());
    for (const e of d.edges) ports[e.to].add(e.port);

    const graph = svg("svg", { width: width, height: height, id: "circuit", class: "circuit" });
    const edgeLayer = svg("g", { class: "edges" });
    const nodeLayer = svg("g", { class: "nodes" });
    graph.append(edgeLayer, nodeLayer);
    d.nodes.forEach((node, i) => {
      const { x, y } = at[i];
      const g = svg("g", { class: "node", "data-label": node.label });
      g.append(svg("rect", { x: x - BOX_W / 2, y: y - BOX_H / 2, width: BOX_W, height: BOX_H, rx: 4 }));
      g.append(svg("text", { x: x, y: y, "text-anchor": "middle", "dominant-baseline": "middle" }, node.label));
      for (const port of ports[i]) {
        if (port) g.append(svg("text", { x: x + PORT_X[port], y: y - BOX_H / 2 - 3, "text-anchor": "middle", class: "port" }, port));
      }
      nodeLayer.append(g);
    });

    // An edge that skips rows runs straight down through a gap between the boxes of each
    // row it crosses (the gap nearest its straight line), so that it never reads as
    // entering a box it passes; between rows it bends, leaving and entering vertically.
    const gaps = rows.map((members) => {
      if (!members || !members.length) return null;
      const first = at[members[0]].x;
      return members.map((_, j) => first - COL / 2 + j * COL).concat([first + members.length * COL - COL / 2]);
    });
    function route(e) {
      const from = at[e.from], to = at[e.to];
      const x1 = from.x, y1 = from.y + BOX_H / 2, x2 = to.x + PORT_X[e.port], y2 = to.y - BOX_H / 2;
      const points = [[x1, y1]];
      for (let row = d.nodes[e.from].row + 1; row < d.nodes[e.to].row; row++) {
        if (!gaps[row]) continue;
        const y = PAD + row * ROW + BOX_H / 2;
        const straight = x1 + (x2 - x1) * (y - y1) / (y2 - y1);
        const x = gaps[row].reduce((best, g) => (Math.abs(g - straight) < Math.abs(best - straight) ? g : best));
        points.push([x, y - BOX_H / 2 - 4], [x, y + BOX_H / 2 + 4]);
      }
      points.push([x2, y2]);
      let path = `M ${x1} ${y1}`;
      for (let i = 1; i < points.length; i++) {
        const [xa, ya] = points[i - 1], [xb, yb] = points[i], bend = (yb - ya) / 2;
        path += xa === xb ? ` L ${xb} ${yb}` : ` C ${xa} ${ya + bend} ${xb} ${yb - bend} ${xb} ${yb}`;
      }
      return path;
    }

    const paths = d.edges.map((e, i) => {
      const path = svg("path", {
        class: "edge", d: route(e),
        "data-index": i, "data-label": e.label, "data-score": String(e.score),
        "data-exact": e.exact === null ? "" : String(e.exact),
      });
      path.addEventListener("click", () => choose(i));
      path.addEventListener("mousemove", (event) => showTip(event, `${e.label}\n${d.method} ${exact(e.score)}`));
      path.addEventListener("mouseleave", hideTip);
      return path;
    });

    // ---- the sidebar: baselines, the chosen edge, the list of shown edges
    const controls = el("div", { class: "controls" });
    controls.append(labelled("show", select("show", choices, state.show, (v) => { state.show = v; draw(); })));
    const side = el("div", { class: "sidebar circuit-side" });
    const facts = el("dl", { id: "baselines" });
    for (const [term, value] of [["scores", d.method], ["clean baseline", exact(d.clean)], ["corrupted baseline", exact(d.corrupted)]]) {
      facts.append(el("dt", {}, term), el("dd", { "data-fact": term }, value));
    }
    const info = el("dl", { id: "edge-info" });
    const list = el("ol", { id: "edge-list", class: "edge-list" });
    side.append(facts, el("h2", {}, "edge"), info, el("h2", {}, "edges shown, by |score|"), list);
    const views = el("div", { class: "views" });
    views.append(graph, side);
    root.append(el("h1", {}, d.title), controls, views);

    function shown() {
      if (state.show === "circuit") return byMagnitude.filter((i) => d.edges[i].in_circuit);
      if (state.show === "all") return byMagnitude;
      return byMagnitude.slice(0, Number(state.show.slice(4)));
    }

    function choose(i) {
      state.selected = i;
      const e = d.edges[i];
      const gap = d.corrupted - d.clean;
      const rows = [
        ["edge", e.label],
        [d.method, exact(e.score)],
        ["normalised", e.score === null || !gap ? "NaN" : short(e.score / gap)],
        ["exact patching effect", e.exact === null ? (d.has_exact ? "NaN" : "not computed") : exact(e.exact)],
        ["in the circuit", e.in_circuit ? "yes" : "no"],
      ];
      info.replaceChildren();
      for (const [term, value] of rows) info.append(el("dt", {}, term), el("dd", { "data-fact": term }, value));
      document.body.dataset.edge = e.label;
      paths.forEach((p, j) => p.classList.toggle("selected", j === i));
      for (const item of list.children) item.classList.toggle("selected", Number(item.dataset.index) === i);
    }

    function draw() {
      const visible = shown();
      const scale = Math.max(1e-30, ...visible.map((i) => Math.abs(d.edges[i].score ?? 0)));
      edgeLayer.replaceChildren();
      list.replaceChildren();
      for (const i of [...visible].reverse()) {  // the largest drawn last, on top
        const e = d.edges[i], path = paths[i];
        path.setAttribute("stroke-width", String(0.6 + 5.4 * Math.abs(e.score ?? 0) / scale));
        path.setAttribute("stroke", (e.score ?? 0) < 0 ? "rgb(200, 30, 30)" : "rgb(29, 78, 216)");
        edgeLayer.append(path);
      }
      for (const i of visible) {
        const e = d.edges[i];
        const item = el("li", { "data-index": i, "data-label": e.label }, `${e.label}  ${short(e.score)}`);
        item.addEventListener("click", () => choose(i));
        list.append(item);
      }
      document.body.dataset.shown = String(visible.length);
      if (state.selected === null && visible.length) choose(visible[0]);
      else if (state.selected !== null) choose(state.selected);
    }
    draw();
  }

  (window.hookedattnViews = window.hookedattnViews || {}).circuit = circuitView;
})();
