/* hookedattn viewer: draws the JSON embedded in this page (element #hookedattn-data).
 * Three views, picked by data.kind: "attention", "bars", "patching" (and those of other
 * scripts on the page, e.g. circuit.js's "circuit"). No library, nothing
 * fetched. Every string from the data reaches the page through textContent or an
 * attribute, never as markup, so markup inside a token is shown as text and never run.
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

  /* A value "exactly" on hover: a float32 as the shortest decimal that reads back as the
   * same float32 (not the 17 digits of its double), anything else as its shortest double. */
  function exact(v) {
    if (v === null || Number.isNaN(v)) return "NaN";
    if (Math.fround(v) !== v) return String(v);
    for (let p = 1; p < 10; p++) {
      const s = v.toPrecision(p);
      if (Math.fround(Number(s)) === v) return String(Number(s));
    }
    return String(v);
  }
  const short = (v) => (v === null ? "NaN" : String(Number(v.toPrecision(4))));

  /* Whitespace and control characters made visible (other control characters written as
   * escapes, "\x1d", as a byte tokenizer writes bytes); the tooltip shows the token quoted. */
  function visible(token) {
    const escape = (c) => "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0");
    const text = token.replace(/ /g, "\u00a0").replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5")
      .replace(/[\u0000-\u001f\u007f]/g, escape);
    return text === "" ? "\u2205" : text;
  }
  const quoted = (token) => JSON.stringify(token);

  const tip = el("div", { class: "tip", id: "tip", role: "status" });
  tip.hidden = true;
  function showTip(event, text) {
    tip.textContent = text;
    tip.hidden = false;
    const x = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 4);
    tip.style.left = Math.max(0, x) + "px";
    tip.style.top = event.clientY + 16 + "px";
  }
  const hideTip = () => { tip.hidden = true; };

  function select(id, options, value, onChange) {
    const node = el("select", { id: id });
    for (const [optionValue, label] of options) node.append(el("option", { value: String(optionValue) }, label));
    node.value = String(value);
    node.addEventListener("change", () => onChange(node.value));
    return node;
  }
  const labelled = (text, control) => { const l = el("label", {}, text + " "); l.append(control); return l; };

  function decodeFloat32(base64) {
    const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    return new Float32Array(bytes.buffer);
  }

  /* A heatmap of rows x columns, one <rect class="cell"> per entry, ticks labelled. */
  function heatmap(rows, cols, options) {
    const cell = Math.max(3, Math.min(28, Math.floor((options.size || 640) / Math.max(rows.length, cols.length))));
    const every = Math.ceil(9 / cell);  // ticks no closer than 9px
    const chars = (ticks) => Math.max(1, ...ticks.map((t) => t.length));
    const left = 24 + 6.2 * Math.min(14, chars(rows)), top = 8;
    const bottom = 30 + 6.2 * Math.min(14, chars(cols));
    const width = left + cols.length * cell + 8, height = top + rows.length * cell + bottom;
    const root = svg("svg", { width: width, height: height, class: "heatmap", id: options.id });
    const cells = svg("g", { class: "cells" });
    const rects = [];
    for (let r = 0; r < rows.length; r++) {
      for (let c = 0; c < cols.length; c++) {
        const rect = svg("rect", { class: "cell", x: left + c * cell, y: top + r * cell, width: cell, height: cell, "data-row": r, "data-col": c });
        rects.push(rect);
        cells.append(rect);
      }
    }
    root.append(cells);
    const clip = (t) => (t.length > 14 ? t.slice(0, 13) + "\u2026" : t);
    rows.forEach((t, r) => {
      if (r % every) return;
      root.append(svg("text", { x: left - 4, y: top + (r + 0.5) * cell, "text-anchor": "end", "dominant-baseline": "middle", class: "row-tick" }, clip(t)));
    });
    cols.forEach((t, c) => {
      if (c % every) return;
      const x = left + (c + 0.5) * cell, y = top + rows.length * cell + 4;
      root.append(svg("text", { x: x, y: y, transform: `rotate(-90 ${x} ${y})`, "text-anchor": "end", "dominant-baseline": "middle", class: "col-tick" }, clip(t)));
    });
    root.append(svg("text", { x: left + (cols.length * cell) / 2, y: height - 4, "text-anchor": "middle", class: "axis-title" }, options.xTitle));
    root.append(svg("text", { x: 10, y: top + (rows.length * cell) / 2, transform: `rotate(-90 10 ${top + (rows.length * cell) / 2})`, "text-anchor": "middle", class: "axis-title" }, options.yTitle));
    const band = svg("rect", { class: "band", visibility: "hidden" });
    root.append(band);
    cells.addEventListener("mousemove", (event) => {
      const t = event.target;
      if (t.classList.contains("cell")) showTip(event, options.describe(Number(t.dataset.row), Number(t.dataset.col)));
    });
    cells.addEventListener("mouseleave", hideTip);
    return {
      node: root,
      rects: rects,
      /* Outline one row or column (the focused token), or nothing. */
      outline(kind, index) {
        if (index === null) { band.setAttribute("visibility", "hidden"); return; }
        const across = kind === "row";
        band.setAttribute("x", across ? left : left + index * cell);
        band.setAttribute("y", across ? top + index * cell : top);
        band.setAttribute("width", across ? cols.length * cell : cell);
        band.setAttribute("height", across ? cell : rows.length * cell);
        band.setAttribute("visibility", "visible");
      },
    };
  }

  function tokenStrip(tokens, onEnter, onLeave, onClick) {
    const strip = el("div", { class: "tokens", id: "tokens" });
    const spans = tokens.map((token, i) => {
      const span = el("span", { class: "token", "data-pos": i, title: `${i}: ${quoted(token)}` }, visible(token));
      span.addEventListener("mouseenter", () => onEnter(i));
      span.addEventListener("mouseleave", () => onLeave(i));
      span.addEventListener("click", () => onClick(i));
      strip.append(span);
      if (token.includes("\n")) strip.append(el("br"));
      return span;
    });
    return { node: strip, spans: spans };
  }

  // ------------------------------------------------------------------ attention
  /* The page's patterns: its heads in order (L0H0, L0H1, ...) and weight(m, q, k) of head m. */
  function patternStore(d) {
    const n = d.tokens.length, flat = decodeFloat32(d.patterns.base64);
    const triangle = d.patterns.triangle, perHead = triangle ? (n * (n + 1)) / 2 : n * n;
    const heads = d.layers.flatMap((layer) => [...Array(d.n_heads).keys()].map((h) => ({ layer: layer, head: h, label: `L${layer}H${h}` })));
    // A causal pattern is stored as its lower triangle: row q holds keys 0..q.
    const weight = (m, q, k) => (triangle ? (k > q ? 0 : flat[m * perHead + (q * (q + 1)) / 2 + k]) : flat[m * perHead + q * n + k]);
    const describe = (m, q, k) => `${heads[m].label}  query ${q} ${quoted(d.tokens[q])} \u2192 key ${k} ${quoted(d.tokens[k])}: ${exact(weight(m, q, k))}`;
    return { n: n, heads: heads, weight: weight, describe: describe };
  }

  /* One head's pattern as a small canvas, exact values on hover; a click picks the head. */
  function thumbnail(store, m, side, onPick) {
    const n = store.n, label = store.heads[m].label;
    const figure = el("figure", { class: "thumb", "data-head": label });
    const canvas = el("canvas", { width: n, height: n });
    canvas.style.width = canvas.style.height = side + "px";
    const context = canvas.getContext("2d"), image = context.createImageData(n, n);
    for (let q = 0; q < n; q++) {
      for (let k = 0; k < n; k++) image.data.set([29, 78, 216, Math.round(255 * store.weight(m, q, k))], 4 * (q * n + k));
    }
    context.putImageData(image, 0, 0);
    const cell = (offset) => Math.min(n - 1, Math.floor((offset / side) * n));
    canvas.addEventListener("mousemove", (event) => showTip(event, store.describe(m, cell(event.offsetY), cell(event.offsetX))));
    canvas.addEventListener("mouseleave", hideTip);
    figure.addEventListener("click", () => onPick(m));
    figure.append(canvas, el("figcaption", {}, label));
    return figure;
  }

  /* Every token's weight from (as the query) or to (as the key) the focused token f. */
  function focusWeights(store, m, f, mode) {
    return [...Array(store.n).keys()].map((j) => (mode === "query" ? store.weight(m, f, j) : store.weight(m, j, f)));
  }

  function focusSummary(store, tokens, m, f, mode, weights) {
    const top = [...weights.keys()].sort((a, b) => weights[b] - weights[a]).slice(0, 3);
    const named = top.map((j) => `${j} ${quoted(tokens[j])} ${exact(weights[j])}`).join(", ");
    const role = mode === "query" ? "pays most to" : "receives most from";
    return `${store.heads[m].label}: token ${f} ${quoted(tokens[f])} ${role} ${named}`;
  }

  /* Each token's background by its weight (and the weight in data-weight), or plain. */
  function colourTokens(spans, focus, weights) {
    spans.forEach((span, j) => {
      span.classList.toggle("focus", j === focus);
      const w = weights === null ? null : weights[j];
      span.style.backgroundColor = w === null ? "" : `rgba(29, 78, 216, ${Math.max(0, Math.min(1, w))})`;
      span.classList.toggle("dark", w !== null && w > 0.5);
      if (w === null) span.removeAttribute("data-weight");
      else span.setAttribute("data-weight", String(w));
    });
  }

  function attentionControls(d, store, state, redraw) {
    const nHeads = d.n_heads;
    const layer = select("layer", d.layers.map((l) => [l, `layer ${l}`]), store.heads[state.m].layer, () => pick());
    const head = select("head", [...Array(nHeads).keys()].map((h) => [h, `head ${h}`]), store.heads[state.m].head, () => pick());
    const grid = el("input", { type: "checkbox", id: "all-heads" });
    grid.checked = state.grid;
    grid.addEventListener("change", () => { state.grid = grid.checked; redraw(); });
    const modes = [["query", "attention paid (token as query)"], ["key", "attention received (token as key)"]];
    const mode = select("mode", modes, state.mode, (v) => { state.mode = v; redraw(); });
    const gridLabel = el("label", {}, " all heads");
    gridLabel.prepend(grid);
    const node = el("div", { class: "controls" });
    node.append(labelled("show", layer), head, gridLabel, labelled("colour tokens by", mode));
    function pick() {
      state.m = d.layers.indexOf(Number(layer.value)) * nHeads + Number(head.value);
      state.grid = false;
      redraw();
    }
    /* The controls showing the state, after a change made elsewhere (a thumbnail's click). */
    function sync() {
      layer.value = String(store.heads[state.m].layer);
      head.value = String(store.heads[state.m].head);
      grid.checked = state.grid;
    }
    return { node: node, sync: sync };
  }

  function attentionView(root, d) {
    const store = patternStore(d), n = store.n;
    const state = { m: d.start.index, grid: d.start.grid, mode: "query", pinned: null, focus: null };
    const controls = attentionControls(d, store, state, draw);
    const strip = tokenStrip(
      d.tokens,
      (i) => { state.focus = i; colour(); },
      () => { state.focus = state.pinned; colour(); },
      (i) => { state.pinned = state.pinned === i ? null : i; state.focus = state.pinned; colour(); },
    );
    const info = el("div", { class: "info", id: "info" });
    const ticks = d.tokens.map(visible);
    const map = heatmap(ticks, ticks, { id: "pattern", xTitle: "key (attended to)", yTitle: "query (attending)", describe: (q, k) => store.describe(state.m, q, k) });
    map.node.querySelector(".cells").setAttribute("fill", "rgb(29, 78, 216)");  // one hue; opacity is the weight
    const title = el("div", { class: "info", id: "current" });
    const single = el("figure", { class: "single" });
    single.append(title, map.node);
    const grid = el("div", { class: "grid", id: "grid" });
    grid.style.gridTemplateColumns = `repeat(${d.n_heads}, max-content)`;  // a row per layer
    const side = Math.max(48, Math.min(160, 2 * n, Math.floor(1100 / d.n_heads) - 10));
    const thumbs = store.heads.map((h, m) => thumbnail(store, m, side, (picked) => { state.m = picked; state.grid = false; draw(); }));
    grid.append(...thumbs);
    const views = el("div", { class: "views" });
    views.append(single, grid);
    root.append(el("h1", {}, d.title), controls.node, strip.node, info, views);

    function draw() {
      const label = store.heads[state.m].label;
      controls.sync();
      title.textContent = `${label}: pattern[query, key], each row sums to 1`;
      map.rects.forEach((rect, i) => {
        const v = store.weight(state.m, Math.floor(i / n), i % n);
        rect.setAttribute("fill-opacity", String(Math.max(0, Math.min(1, v))));
        rect.setAttribute("data-value", String(v));
      });
      single.hidden = state.grid;
      grid.hidden = !state.grid;
      thumbs.forEach((t, m) => t.classList.toggle("selected", m === state.m));
      document.body.dataset.head = label;
      colour();
    }

    function colour() {
      const f = state.focus;
      const weights = f === null ? null : focusWeights(store, state.m, f, state.mode);
      colourTokens(strip.spans, f, weights);
      map.outline(state.mode === "query" ? "row" : "column", f);
      info.textContent = f === null ? "hover over a token, or click it to keep it" : focusSummary(store, d.tokens, state.m, f, state.mode, weights);
    }

    draw();
  }

  // ------------------------------------------------------------------- bars
  function barsView(root, d) {
    const state = { pos: d.start_pos, order: "model" };
    const orders = [["model", "model order"], ["value", "value, largest first"], ["abs", "|value|, largest first"], ["label", "label"]];
    const sortSelect = select("sort", orders, state.order, (v) => { state.order = v; draw(); });
    const controls = el("div", { class: "controls" });
    controls.append(labelled("sort by", sortSelect));
    const strip = tokenStrip(d.tokens, () => {}, () => {}, (i) => { state.pos = i; draw(); });
    const info = el("div", { class: "info", id: "info" });
    const bars = el("div", { class: "bars", id: "bars" });
    root.append(el("h1", {}, d.title), controls, strip.node, info, bars);

    function draw() {
      const values = d.values[state.pos];
      const order = [...values.keys()];
      const by = {
        model: () => 0,
        value: (a, b) => values[b] - values[a],
        abs: (a, b) => Math.abs(values[b]) - Math.abs(values[a]),
        label: (a, b) => d.labels[a].localeCompare(d.labels[b], undefined, { numeric: true }),
      };
      order.sort(by[state.order]);
      // A reduction, not a spread into arguments: a long row would exceed the call stack.
      const scale = values.reduce((m, v) => Math.max(m, Math.abs(v)), 0) || 1;
      bars.replaceChildren();
      for (const c of order) {
        const v = values[c];
        const row = { "data-label": d.labels[c], "data-value": String(v) };
        const track = el("div", Object.assign({ class: "bar-track" }, row));
        const bar = el("div", { class: v < 0 ? "bar neg" : "bar pos" });
        bar.style.width = (50 * Math.abs(v)) / scale + "%";
        track.append(bar);
        track.addEventListener("mousemove", (event) => showTip(event, `${d.labels[c]}: ${exact(v)}`));
        track.addEventListener("mouseleave", hideTip);
        bars.append(el("span", { class: "bar-label" }, d.labels[c]), track, el("span", { class: "bar-value" }, short(v)));
      }
      strip.spans.forEach((span, i) => span.classList.toggle("selected", i === state.pos));
      const total = values.reduce((a, b) => a + b, 0);
      const token = d.tokens[state.pos];
      info.textContent = `${d.what} at position ${state.pos} ${quoted(token)} (click a token for another): ${values.length} components, sum ${short(total)}`;
    }
    draw();
  }

  // ---------------------------------------------------------------- patching
  function patchingView(root, d) {
    const shape = d.labels.map((t) => t.length);
    const extra = d.axes.slice(2).map(() => 0);
    const state = { quantity: "normalised" };
    const quantities = [["normalised", "normalised (0 corrupted, 1 clean)"], ["values", "patched metric"], ["effect", "effect (patched minus the run patched into)"]];
    const controls = el("div", { class: "controls" });
    controls.append(labelled("show", select("quantity", quantities, state.quantity, (v) => { state.quantity = v; draw(); })));
    d.axes.slice(2).forEach((axis, i) => {
      controls.append(labelled(axis, select(`axis-${axis}`, d.labels[i + 2].map((t, j) => [j, t]), 0, (v) => { extra[i] = Number(v); draw(); })));
    });
    const rows = d.axes.length > 1 ? d.labels[0] : [""];
    const cols = d.axes.length > 1 ? d.labels[1] : d.labels[0];
    const flatIndex = (r, c) => {
      const index = d.axes.length > 1 ? [r, c, ...extra] : [c];
      return index.reduce((acc, i, axis) => acc * shape[axis] + i, 0);
    };
    const describe = (r, c) => {
      const i = flatIndex(r, c);
      return `${d.cell_labels[i]}\nnormalised ${exact(d.normalised[i])}\npatched metric ${exact(d.values[i])}\neffect ${exact(d.effect[i])}`;
    };
    const map = heatmap(rows, cols, { id: "patching", size: 420, xTitle: d.axes.length > 1 ? d.axes[1] : d.axes[0], yTitle: d.axes.length > 1 ? d.axes[0] : "", describe: describe });
    const side = el("dl", { class: "sidebar", id: "baselines" });
    const facts = [
      ["method", `${d.method}, ${d.direction}`], ["patched", d.patch_kind], ["prompts", String(d.n_prompts)],
      ["clean baseline", exact(d.clean)], ["corrupted baseline", exact(d.corrupted)],
    ];
    for (const [term, value] of facts) side.append(el("dt", {}, term), el("dd", { "data-fact": term }, value));
    const legend = el("dd", { id: "scale" });
    side.append(el("dt", {}, "colour"), legend);
    const views = el("div", { class: "views" });
    views.append(map.node, side);
    root.append(el("h1", {}, d.title), controls, views);

    function draw() {
      const values = d[state.quantity];
      const shown = map.rects.map((rect, i) => values[flatIndex(Math.floor(i / cols.length), i % cols.length)]);
      // Normalised scores keep their meaning (1: as clean) on a scale of at least 1.
      const floor = state.quantity === "normalised" ? 1 : 0;
      const scale = Math.max(floor, ...shown.map((v) => (v === null ? 0 : Math.abs(v)))) || 1;
      map.rects.forEach((rect, i) => {
        const v = shown[i];
        rect.setAttribute("data-value", v === null ? "NaN" : String(v));
        rect.setAttribute("fill", v === null ? "#bbb" : v < 0 ? "rgb(200, 30, 30)" : "rgb(29, 78, 216)");
        rect.setAttribute("fill-opacity", v === null ? "1" : String(Math.abs(v) / scale));
      });
      legend.replaceChildren(el("span", {}, `\u2212${short(scale)} `), el("span", { class: "legend" }), el("span", {}, ` +${short(scale)}; grey: NaN`));
    }
    draw();
  }

  const data = JSON.parse(document.getElementById("hookedattn-data").textContent);
  const root = document.getElementById("hookedattn-root");
  root.replaceChildren();
  document.body.append(tip);
  // Views in scripts of their own (circuit.js) register in window.hookedattnViews and
  // get the drawing helpers here as their third argument.
  const views = Object.assign({ attention: attentionView, bars: barsView, patching: patchingView },
    window.hookedattnViews || {});
  const kit = { el, svg, showTip, hideTip, exact, short, select, labelled };
  if (!(data.kind in views)) throw new Error(`no view for data of kind ${quoted(data.kind)}`);
  views[data.kind](root, data, kit);
  document.body.dataset.ready = "true";
})();
