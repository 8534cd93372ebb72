// paraxis lab: chapters 4-6 (pipeline schedules, ZeRO memory, the 3D grid). Figures come
// from DATA or from core.js's pure functions; see core.js.
"use strict";

// ------------------------------------------------------------- chapter 4: pipelines
(function pipeline() {
  const d = DATA.pipeline, svg = $("pipe-svg"), curve = $("pipe-curve");
  let kind = "gpipe", result = null, shownUpTo = Infinity;
  const NAMES = ["F", "B", "W"], CHUNKS = "abcdefgh";
  function entry(microbatches) {
    const v = kind === "interleaved" ? virtualS.get() : d.kind_virtual[kind];
    return d.orders[kind + "/" + stagesS.get() + "/" + (microbatches || mbS.get()) + "/" + v];
  }
  // An op as `paraxis schedule` prints it: F3 = forward of microbatch 3, F3b the same through
  // the stage's second chunk when it has several (paraxis.show.viz.text_timeline).
  const opLabel = (k, mb, chunk, v) => NAMES[k] + mb + (v > 1 ? CHUNKS[chunk] : "");
  // A stage's later chunks in lighter shades of the op's colour: mixed with white, up to 55%.
  function shade(colour, chunk, v) {
    const t = v > 1 ? 0.55 * chunk / (v - 1) : 0;
    const mix = (i) => Math.round(parseInt(colour.slice(i, i + 2), 16) * (1 - t) + 255 * t);
    return "rgb(" + mix(1) + ", " + mix(3) + ", " + mix(5) + ")";
  }
  const pale = (chunk, v) => v > 1 && chunk / (v - 1) > 0.5;  // dark text on a light shade
  // The course's batch is fixed and cut into M microbatches, so an op drawn at cost c (in one
  // microbatch's forward-times) takes c/M of T, one stage's forward over the whole batch:
  // the step is the timeline / M (GPipe's (M+P-1)(1+2)/M T; Huang et al. 2019, sec. 2.3).
  // The overhead model adds a fixed o of T to every microbatch's forward and 2o to its
  // backward (twice the GEMMs), which scales every op alike: step = timeline x (1/M + o).
  const fixedBatchStep = (timeline, microbatches, overhead) =>
    timeline * (1 / microbatches + overhead);
  // rounded to 1e-9 first: a timeline's float sums (55/16 as 3.43749999...) print alike
  const figure = (x) => fmt(Math.round(x * 1e9) / 1e9, 4);
  function legend(e) {
    const box = $("pipe-legend"), v = e.virtual, P = stagesS.get();
    box.innerHTML = "";
    const split = e.orders.some((o) => o.some((n, i) => i % 3 === 0 && n === 2));
    const item = (cls, colour, words, chunk) => {
      const span = el("span", {class: cls}, box);
      if (chunk !== undefined) span.dataset.chunk = chunk;
      el("span", {class: "swatch", style: "background: " + colour}, span);
      span.appendChild(document.createTextNode(words));
    };
    item("kind", COLOURS.F, "forward");
    item("kind", COLOURS.B, split ? "backward (input gradient)" : "backward");
    if (split) item("kind", COLOURS.W, "weight gradient");
    item("kind", COLOURS.idle, "idle (the bubble)");
    if (v === 1) return;
    el("br", {}, box);
    box.appendChild(document.createTextNode("Each stage runs " + v + " chunks of layers, " +
      "later ones lighter (s: the stage, of P = " + P + "): "));
    // where a chunk's layers sit in the model: virtualStageOf in core.js
    const where = (c) => e.placement === "v" ? (c ? "2P−1−s, the V's way back" : "s")
      : (c ? (c > 1 ? c : "") + "P+s" : "s");
    for (let c = 0; c < v; c++) item("chunk", shade(COLOURS.F, c, v), "F0" + CHUNKS[c] +
      ": chunk " + CHUNKS[c] + ", virtual stage " + where(c), CHUNKS[c]);
  }
  function draw() {
    const P = stagesS.get(), M = mbS.get(), e = entry();
    svg.innerHTML = "";
    if (e.error) {
      result = null;
      // the schedule's own reason, with the M values on this slider that would run it
      const runs = d.microbatches.filter((m) => !entry(m).error);
      $("pipe-error").textContent = e.error + (runs.length
        ? " (on the slider: M = " + runs.join(", ") + ")"
        : " (no M on the slider runs it at P = " + P + ": choose another P)");
      svg.setAttribute("viewBox", "0 0 900 0");  // no timeline: no empty space for one
      $("pipe-legend").innerHTML = "";
      for (const id of ["pipe-bubble", "pipe-makespan", "pipe-peak", "pipe-step",
        "pipe-step-overhead"]) $(id).textContent = "—";
      return;
    }
    $("pipe-error").textContent = "";
    const slow = slowS.get() === "none" ? -1 : slowS.get();
    const [f, b] = stageCosts(P, slow);
    result = simulate(e, P, f, b);
    // drawn in a 900-unit viewBox that the page scales to its width
    const W = 900, row = Math.min(34, 260 / P);
    svg.setAttribute("viewBox", "0 0 " + W + " " + (row * P + 4));
    // the stage names first: the timeline starts right of the widest ("stage 2 (slow)")
    const names = Array.from({length: P}, (_, s) => el("text",
      {x: 4, y: s * row + row / 2 + 4, class: "tick" + (s === slow ? " slow" : "")}, svg,
      "stage " + s + (s === slow ? " (slow)" : "")));
    const L = Math.max(70, ...names.map((name) => name.getBBox().width + 12));
    const scale = (W - L - 10) / result.makespan;
    for (let s = 0; s < P; s++) {
      el("rect", {x: L, y: s * row + 2, width: result.makespan * scale, height: row - 4,
        fill: COLOURS.idle}, svg);
      for (const [start, end, k, mb, chunk] of result.events[s]) {
        if (start >= shownUpTo) continue;
        const label = opLabel(k, mb, chunk, e.virtual);
        const g = el("g", {class: "op", "data-stage": s, "data-op": label}, svg);
        // a hover names the op and its times (core.js's el makes no SVG <title>)
        g.appendChild(document.createElementNS(SVGNS, "title")).textContent = label +
          " on stage " + s + ": " + figure(start) + " to " + figure(end);
        el("rect", {x: L + start * scale, y: s * row + 2, width: Math.max(1, (end - start) * scale - 1),
          height: row - 4, fill: shade(COLOURS[NAMES[k]], chunk, e.virtual)}, g);
        if ((end - start) * scale > 6 * label.length + 4) el("text", {x: L + (start + end) / 2 * scale,
          y: s * row + row / 2 + 4, "text-anchor": "middle",
          class: "blocklabel" + (pale(chunk, e.virtual) ? " pale" : "")}, g, label);
      }
    }
    if (shownUpTo < Infinity) el("line", {x1: L + shownUpTo * scale, x2: L + shownUpTo * scale,
      y1: 0, y2: row * P, stroke: "#212529", "stroke-width": 2}, svg);
    legend(e);
    $("pipe-bubble").textContent = result.fraction + " = " + pct(result.bubble);
    $("pipe-makespan").textContent = figure(result.makespan) + " microbatch forward-times";
    $("pipe-step").textContent = figure(fixedBatchStep(result.makespan, M, 0)) + " T (= " +
      figure(result.makespan) + " ÷ " + M + ")";
    $("pipe-step-overhead").textContent =
      figure(fixedBatchStep(result.makespan, M, overheadS.get())) + " T";
    $("pipe-peak").textContent = result.peak.join(" ") + (e.virtual === 1
      ? " (microbatches' activations)" : " (chunks' activations, each 1/" + e.virtual +
      " of a microbatch's)");
  }
  // The fixed batch's step against M (every M this kind runs at this P), with no overhead
  // and with the chosen o; the smallest with o is marked and named.
  function drawCurve() {
    curve.innerHTML = "";
    const P = stagesS.get(), o = overheadS.get(), slow = slowS.get() === "none" ? -1
      : slowS.get();
    const [f, b] = stageCosts(P, slow), all = d.microbatches;
    const points = all.filter((m) => !entry(m).error).map((m) => {
      const timeline = simulate(entry(m), P, f, b).makespan;
      return {m, ideal: fixedBatchStep(timeline, m, 0), step: fixedBatchStep(timeline, m, o)};
    });
    if (!points.length) {  // interleaved with no M on the slider a multiple of P
      $("pipe-best").textContent = "No M on the slider (" + all.join(", ") + ") makes this " +
        "schedule at P = " + P + ": it needs M a multiple of P; choose another P.";
      return;
    }
    const W = 460, H = 190, L = 40, R = 14, T = 26, B = 34;
    const top = 1.08 * Math.max(...points.map((p) => p.step));
    const x = (m) => L + all.indexOf(m) * (W - L - R) / (all.length - 1);
    const y = (v) => H - B - v / top * (H - T - B);
    el("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: "#adb5bd"}, curve);
    el("line", {x1: L, x2: L, y1: T - 6, y2: H - B, stroke: "#adb5bd"}, curve);
    for (const m of all) el("text", {x: x(m), y: H - B + 14, "text-anchor": "middle",
      class: "tick"}, curve, String(m));
    el("text", {x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", class: "tick"}, curve,
      "microbatches M (the batch fixed)");
    for (const frac of [0.5, 1]) {
      const v = top / 1.08 * frac;
      el("text", {x: L - 4, y: y(v) + 4, "text-anchor": "end", class: "tick"}, curve,
        String(+v.toFixed(1)));
    }
    el("text", {x: 4, y: 12, class: "tick"}, curve, "step time, T");
    const line = (key, attrs) => el("polyline", Object.assign({fill: "none",
      points: points.map((p) => x(p.m) + "," + y(p[key])).join(" ")}, attrs), curve);
    line("ideal", {stroke: "#868e96", "stroke-dasharray": "5 4", "stroke-width": 1.5});
    line("step", {stroke: COLOURS.dp, "stroke-width": 2});
    el("text", {x: W - R, y: 12, "text-anchor": "end", class: "tick"}, curve,
      "solid: o = " + 100 * o + "% · dashed: no overhead");
    const best = points.reduce((a, p) => (p.step < a.step ? p : a), points[0]);
    for (const p of points) {
      el("circle", {cx: x(p.m), cy: y(p.step), r: p.m === mbS.get() ? 5 : 3,
        fill: p.m === mbS.get() ? "#212529" : COLOURS.dp, class: "point", "data-m": p.m,
        "data-step": p.step}, curve);
    }
    el("circle", {cx: x(best.m), cy: y(best.step), r: 8, fill: "none", stroke: "#2b8a3e",
      "stroke-width": 2, class: "best", "data-m": best.m}, curve);
    const [first, last] = [points[0].m, points[points.length - 1].m];
    const chosen = points.some((p) => p.m === mbS.get()) ? "; black: the M chosen above" : "";
    const at = "M = " + best.m + " (" + figure(best.step) + " T, the green ring" + chosen + ")";
    $("pipe-best").textContent = o === 0
      ? "With no overhead in the model, the fixed batch's step only falls as M grows (the " +
        "bubble shrinks): shortest at the largest, " + at + "."
      : "In this model (not a measurement), with o = " + 100 * o + "% of T per microbatch, " +
        "the fixed batch's step is shortest at " + at + (best.m === last
          ? ", the largest M here: the bubble still outweighs the overhead."
          : best.m === first ? ", the smallest M here: the overhead outweighs the bubble."
            : ". Fewer microbatches leave a larger bubble, more pay the overhead more often: " +
              "tune M.");
  }
  const redraw = () => {
    shownUpTo = Infinity; if (animation) animation.stop();
    $("pipe-answer").textContent = "";  // an answer was for the settings it was asked at
    draw(); drawCurve();
  };
  const stagesS = slider("pipe-stages", d.stages, 4, () => {
    slowS.setValues(["none", ...Array.from({length: stagesS.get()}, (_, s) => s)]); redraw(); });
  const mbS = slider("pipe-mb", d.microbatches, 4, redraw);
  const virtualS = slider("pipe-virtual", d.virtual, 2, redraw);
  const overheadS = slider("pipe-overhead", d.overheads, d.overhead, redraw,
    (o) => (o ? 100 * o + "% of T" : "none"));
  // which stage is slow: a <select> of "none" and the stages of the current P
  const slowS = {
    get: () => ($("pipe-slow").value === "none" ? "none" : Number($("pipe-slow").value)),
    set: (value) => { $("pipe-slow").value = String(value); redraw(); },
    setValues: (values) => {
      const keep = $("pipe-slow").value, select = $("pipe-slow");
      select.innerHTML = "";
      for (const v of values) el("option", {value: String(v)}, select, String(v));
      select.value = values.map(String).includes(keep) ? keep : "none";
    }};
  slowS.setValues(["none", 0, 1, 2, 3]);
  $("pipe-slow").addEventListener("input", redraw);
  document.querySelectorAll("#pipe-kinds button").forEach((button) =>
    button.addEventListener("click", () => {
      kind = button.dataset.kind;
      document.querySelectorAll("#pipe-kinds button").forEach((b) =>
        b.classList.toggle("active", b === button));
      $("pipe-virtual").disabled = kind !== "interleaved";
      showVirtual();
      redraw();
    }));
  const animation = (() => {
    let timer = null;
    const stop = () => { if (timer) clearInterval(timer); timer = null; };
    $("pipe-play").addEventListener("click", () => {
      stop(); if (!result) return;
      shownUpTo = 0; draw();
      const dt = result.makespan / 40;
      timer = setInterval(() => {
        shownUpTo += dt;
        if (shownUpTo >= result.makespan) { stop(); shownUpTo = Infinity; }
        draw();
      }, 60);
    });
    return {stop};
  })();
  $("pipe-virtual").disabled = true;
  // the v each kind runs: the slider's under interleaved, the kind's own otherwise (zb-v 2)
  function showVirtual() {
    $("pipe-virtual-value").textContent = String(kind === "interleaved" ? virtualS.get()
      : d.kind_virtual[kind]);
  }
  showVirtual();
  draw(); drawCurve();
  $("pipe-check").addEventListener("click", () => {
    document.querySelector("#pipe-kinds button[data-kind=gpipe]").click();
    stagesS.set(4); mbS.set(8); slowS.set("none");
    $("pipe-answer").textContent = "P = 4, M = 8: bubble " + $("pipe-bubble").textContent + ".";
  });
  window.lab.widgets.pipeline = {stagesS, mbS, virtualS, slowS, overheadS, draw,
    result: () => result};
})();

// --------------------------------------------------------------------- chapter 5: ZeRO
(function zero() {
  const d = DATA.zero, svg = $("zero-svg");
  const PARTS = [["params", COLOURS.dp], ["grads", COLOURS.B], ["optimizer", COLOURS.F]];
  // the planner's rule (facts.fits_on_gpu): the states and the memory held back on every GPU
  // within the GPU's memory
  const fits = (bytes, gpu) => bytes + gpu.reserved_bytes <= gpu.memory_bytes;
  function draw() {
    const rows = d.tables[modelS.get() + "/" + gpusS.get()], name = gpuS.get();
    const gpu = d.gpu_memory[name], limit = gpu.memory_bytes;
    svg.innerHTML = "";
    $("zero-answer").textContent = "";  // an answer was for the settings it was asked at
    // the bars take x up to 476 (the chosen one's frame); right of them, a column of its own
    // for the GPU-memory line's label (the preset's name over its memory), so no bar can
    // reach it
    const W = 600, H = 260, L = 50, T = 24, B = 40, LABEL_X = 486;
    const top = Math.max(limit * 1.15, ...rows.map((r) => r.total));
    const y = (v) => H - B - (v / top) * (H - T - B);
    const chosen = stageS.get();
    // painted in this order: the reserve's band and the bars, the GPU-memory line over them,
    // the figures over the line
    const bars = el("g", {}, svg);
    el("rect", {x: L, y: y(limit), width: LABEL_X - 4 - L,
      height: y(limit - gpu.reserved_bytes) - y(limit), fill: "#ffe3e3", class: "reserve"}, bars);
    el("line", {x1: L, x2: LABEL_X - 4, y1: y(limit), y2: y(limit), stroke: "#c92a2a",
      "stroke-dasharray": "6 4", "stroke-width": 2}, svg);
    const label = el("text", {x: LABEL_X, y: y(limit) - 3, class: "tick limit"}, svg);
    for (const [i, line] of [name, gb(limit)].entries()) {
      const span = label.appendChild(document.createElementNS(SVGNS, "tspan"));
      span.setAttribute("x", LABEL_X);
      if (i) span.setAttribute("dy", 14);
      span.textContent = line;
    }
    const labels = el("g", {}, svg);
    rows.forEach((r, i) => {
      const x = L + 20 + i * 110;
      if (i === chosen) el("rect", {x: x - 6, y: y(r.total) - 18, width: 82,
        height: H - B - y(r.total) + 18, fill: "none", stroke: "#212529", "stroke-width": 2},
      bars);
      let base = 0;
      for (const [part, colour] of PARTS) {
        el("rect", {x, y: y(base + r[part]), width: 70, height: y(base) - y(base + r[part]),
          fill: colour}, bars);
        base += r[part];
      }
      el("text", {x: x + 35, y: y(r.total) - 4, "text-anchor": "middle", class: "tick halo"},
        labels, gb(r.total));
      el("text", {x: x + 35, y: H - B + 16, "text-anchor": "middle", class: "tick"}, labels,
        i ? "ZeRO-" + i : "baseline");
      $("zero-" + i).textContent = gb(r.total);
      $("zero-fit-" + i).textContent = fits(r.total, gpu) ? "fits" : "does not fit";
    });
    $("zero-reserve").textContent = gb(gpu.reserved_bytes);
    const sent = rows[chosen].traffic;
    $("zero-traffic").textContent = gpusS.get() > 1
      ? gb(sent) + " (" + fmt(sent / rows[1].traffic) + "x ZeRO-1's)"
      : "nothing (one GPU)";
    // the largest model on the slider whose states fit at the chosen stage
    const fitting = d.models.filter((m) => fits(d.tables[m + "/" + gpusS.get()][chosen].total,
      gpu));
    $("zero-largest").textContent = fitting.length ? fitting[fitting.length - 1] + "B"
      : "none of " + d.models[0] + "B and up";
  }
  const modelS = slider("zero-model", d.models, 7, draw, (v) => v + "B");
  const gpusS = slider("zero-gpus", d.gpus, 8, draw);
  const gpuS = slider("zero-memory", d.gpu_presets, d.default_gpu, draw,
    (name) => name + ": " + gb(d.gpu_memory[name].memory_bytes));
  const stageS = slider("zero-stage", [0, 1, 2, 3], 3, draw, (v) => (v ? "ZeRO-" + v : "none"));
  draw();
  $("zero-check").addEventListener("click", () => {
    modelS.set(13); gpusS.set(16); stageS.set(3);  // the stage the question asks about
    $("zero-answer").textContent = "13B on 16 GPUs: baseline " + $("zero-0").textContent +
      ", ZeRO-3 " + $("zero-3").textContent + " per GPU.";
  });
  window.lab.widgets.zero = {modelS, gpusS, gpuS, stageS};
})();

// ------------------------------------------------------------ chapter 6: the 3D grid
(function grid() {
  const d = DATA.grid, box = $("grid-cells"), shardSelect = $("grid-shard");
  // a rank's copies (its place in the other shard groups) get a ring of their own colour
  const RINGS = Object.assign({dp_replicate: "#d6336c"}, COLOURS);
  let layout = null, shards = null, outlines = [];
  function key() {
    return [dpS.get(), tpS.get(), ppS.get(), cpS.get(), epS.get()].join("/");
  }
  // The shard-group choices: every dp rank, then the hybrid dp_shard sizes DATA has for this
  // setting, largest first; the chosen one is kept while it stays a choice.
  function setShardChoices() {
    const keep = shardSelect.value, base = d.layouts[key()];
    const sizes = base.error ? [] : Object.keys(base.shards).sort((a, b) => b - a);
    shardSelect.innerHTML = "";
    el("option", {value: "0"}, shardSelect, "all dp ranks");
    // a shard group is dp_shard dp ranks x every cp rank (they hold the same parameters)
    const cp = cpS.get();
    for (const size of sizes) el("option", {value: size}, shardSelect,
      size + (size === "1" ? " dp rank" : " dp ranks") +
      (cp > 1 ? " x cp " + cp + " = " + size * cp + " GPUs" : ""));
    shardSelect.value = sizes.includes(keep) ? keep : "0";
    shardSelect.disabled = !sizes.length;
  }
  function draw() {
    setShardChoices();
    layout = d.layouts[key()];
    shards = layout.error || shardSelect.value === "0" ? null : layout.shards[shardSelect.value];
    box.innerHTML = "";
    outlines = [];
    $("grid-role").textContent = "Hover over a GPU.";
    $("grid-answer").textContent = "";  // an answer was for the settings it was asked at
    const error = layout.error || (shards && shards.error);
    if (error) {  // no grid: no world size either (not the last valid one's)
      $("grid-error").textContent = error;
      $("grid-world").textContent = "—";
      $("grid-role").textContent = "";
      return;
    }
    $("grid-error").textContent = "";
    const [dp, tp, pp, cp] = [dpS.get(), tpS.get(), ppS.get(), cpS.get()];
    $("grid-world").textContent = layout.coords.length;
    // every item is placed by (row, column), so a shard group's outline can share its cells'
    // grid area: row 1 and column 1 hold the axis labels
    const area = (row, col, rows, cols) => "grid-area: " + (row + 2) + " / " + (col + 2) +
      " / span " + (rows || 1) + " / span " + (cols || 1);
    for (let stage = 0; stage < pp; stage++) {
      const panel = el("div", {class: "stage"}, box);
      el("div", {class: "title"}, panel, "pipeline stage " + stage);
      const table = el("div", {class: "cells", style: "grid-template-columns: auto repeat(" +
        dp * cp + ", 1fr)"}, panel);
      el("div", {class: "axislabel", style: area(-1, -1)}, table, "");
      for (let col = 0; col < dp * cp; col++) {
        el("div", {class: "axislabel", style: area(-1, col)}, table, "dp" +
          Math.floor(col / cp) + (cp > 1 ? " cp" + (col % cp) : ""));
      }
      const place = {};  // rank -> [row, column] on this stage
      for (let t = 0; t < tp; t++) for (let col = 0; col < dp * cp; col++) {
        if (col === 0) el("div", {class: "axislabel", style: area(t, -1)}, table, "tp" + t);
        const rank = layout.coords.findIndex(([a, c, tt, p]) => p === stage && tt === t &&
          a * cp + c === col);
        place[rank] = [t, col];
        const node = Math.floor(rank / nodeS.get());
        const cell = el("div", {class: "gpucell node" + (node % 2), id: "grid-rank-" + rank,
          "data-rank": rank, style: area(t, col)}, table, "GPU " + rank);
        cell.addEventListener("mouseenter", () => hover(rank));
      }
      for (const group of shards ? shards.dp_shard : []) {
        if (!(group[0] in place)) continue;  // another stage's
        const rows = group.map((r) => place[r][0]), cols = group.map((r) => place[r][1]);
        const [row, col] = [Math.min(...rows), Math.min(...cols)];
        outlines.push({group, node: el("div", {class: "shardgroup", "data-ranks": group.join(" "),
          style: area(row, col, Math.max(...rows) - row + 1, Math.max(...cols) - col + 1)},
          table)});
      }
    }
  }
  const ROLES = {tp: "split every layer's matrices (one node's fast links)",
    pp: "the other stages' layers of this replica", dp: "the same layers, other data",
    cp: "split every sequence", ep: "split the experts"};
  function hover(rank) {
    document.querySelectorAll(".gpucell").forEach((c) => {
      c.removeAttribute("data-axis");
      c.style.boxShadow = "";
    });
    for (const {group, node} of outlines) node.classList.toggle("mine", group.includes(rank));
    const lines = [layout.labels[String(nodeS.get())][rank]], rings = {};
    const ring = (group, axis) => {
      for (const r of group) if (r !== rank) (rings[r] = rings[r] || []).push(axis);
    };
    for (const axis of ["dp", "pp", "cp", "ep", "tp"]) {
      const group = layout.groups[axis].find((g) => g.includes(rank));
      if (group.length < 2) continue;
      ring(group, axis);
      lines.push(axis.toUpperCase() + " group " + JSON.stringify(group) + ": " + ROLES[axis]);
    }
    if (shards) {  // hybrid sharding: the rank's shard group (outlined) and its copies
      const own = shards.dp_shard.find((g) => g.includes(rank));
      const copies = shards.dp_replicate.find((g) => g.includes(rank));
      ring(copies, "dp_replicate");
      lines.push("ZeRO shard group " + JSON.stringify(own) + ": optimizer states sharded " +
        "within (this grid's ZeRO-1; HSDP shards parameters and gradients there too)" +
        (cpS.get() > 1 ? ", its dp_shard dp ranks x cp " + cpS.get() : ""));
      lines.push("DP copies " + JSON.stringify(copies) + ": the same shard, gradients " +
        "all-reduced across (this GPU is copy " + copies.indexOf(rank) + ")");
    }
    // a GPU in several of the groups (cp and ep can coincide) gets a ring per group
    for (const [r, axes] of Object.entries(rings)) {
      const cell = $("grid-rank-" + r);
      cell.setAttribute("data-axis", axes.join(" "));
      cell.style.boxShadow = axes.map((a, i) => "0 0 0 " + 3 * (i + 1) + "px " + RINGS[a])
        .join(", ");
    }
    $("grid-rank-" + rank).setAttribute("data-axis", "me");
    $("grid-role").textContent = lines.join("\n");
  }
  const dpS = slider("grid-dp", d.degrees, 4, draw);
  const tpS = slider("grid-tp", d.degrees, 4, draw);
  const ppS = slider("grid-pp", d.degrees, 4, draw);
  const cpS = slider("grid-cp", d.cp, 1, draw);
  const epS = slider("grid-ep", d.ep, 1, draw);
  const nodeS = slider("grid-node", d.gpus_per_node, 4, draw);
  // dp_shard as DATA keys it ("0": every dp rank); a size that is not a choice here reads "0"
  const shardS = {get: () => Number(shardSelect.value),
    set: (size) => { shardSelect.value = String(size); draw(); }};
  shardSelect.addEventListener("input", draw);
  draw();
  $("grid-check").addEventListener("click", () => {
    shardSelect.value = "0";
    dpS.set(4); tpS.set(4); ppS.set(4); cpS.set(1); epS.set(1); nodeS.set(4);
    hover(5);
    $("grid-answer").textContent = "Tensor parallelism: GPU 5's TP group " +
      JSON.stringify(layout.groups.tp.find((g) => g.includes(5))) + " is one node's " +
      nodeS.get() + " GPUs (" + layout.labels["4"][5] + ").";
  });
  window.lab.widgets.grid = {dpS, tpS, ppS, cpS, epS, nodeS, shardS, hover};
})();
