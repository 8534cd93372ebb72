// paraxis lab: chapters 0-3 (the scaling gap, data parallelism, ring all-reduce, tensor
// parallelism). Figures come from DATA; see core.js.
"use strict";

// ------------------------------------------------------------- chapter 0: scaling gap
(function scalingGap() {
  const params = (n) => n < 1e12 ? +(n / 1e9).toPrecision(3) + "B"
    : n < 1e15 ? +(n / 1e12).toPrecision(3) + "T" : n.toExponential(2);
  // bytes on the axis in words (the sliders' "B" is billions of parameters)
  const bytes = (n) => {
    const units = [[1e15, "PB"], [1e12, "TB"], [1e9, "GB"], [1e6, "MB"]];
    const [size, name] = units.find(([u]) => n >= u) || [1, "bytes"];
    return +(n / size).toPrecision(3) + " " + name;
  };
  const gpus = (n) => n + (n === 1 ? " GPU" : " GPUs");
  const d = DATA.scaling, svg = $("scaling-chart");
  const W = 560, H = 240, L = 60, R = 20, T = 15, B = 30;
  const ys = d.years.flatMap((y) => [y.state_bytes, y.gpu_bytes, y.published_state_bytes]);
  const lo = Math.floor(Math.log10(Math.min(...ys))), hi = Math.ceil(Math.log10(Math.max(...ys)));
  const x = (i) => L + (i * (W - L - R)) / (d.years.length - 1);
  const y = (v) => T + ((hi - Math.log10(v)) * (H - T - B)) / (hi - lo);
  for (let e = lo; e <= hi; e += 2) {
    el("line", {x1: L, x2: W - R, y1: y(10 ** e), y2: y(10 ** e), stroke: "#dee2e6"}, svg);
    el("text", {x: L - 6, y: y(10 ** e) + 4, "text-anchor": "end", class: "tick"}, svg,
      bytes(10 ** e));
  }
  d.years.forEach((yr, i) => el("text", {x: x(i), y: H - 10, "text-anchor": "middle",
    class: "tick"}, svg, yr.year));
  const line = (key, colour) => el("polyline", {fill: "none", stroke: colour, "stroke-width": 3,
    points: d.years.map((yr, i) => x(i) + "," + y(yr[key])).join(" ")}, svg);
  line("state_bytes", COLOURS.B); line("gpu_bytes", COLOURS.F);
  d.years.forEach((yr, i) => el("circle", {cx: x(i), cy: y(yr.published_state_bytes), r: 5,
    fill: COLOURS.W}, svg));
  const marker = el("line", {y1: T, y2: H - B, stroke: "#495057", "stroke-dasharray": "4 3"}, svg);
  const year = slider("scaling-year", d.years.map((yr) => yr.year), 2020, (value) => {
    const i = d.years.findIndex((yr) => yr.year === value), yr = d.years[i];
    marker.setAttribute("x1", x(i)); marker.setAttribute("x2", x(i));
    $("scaling-year-out").textContent = value + ": the trend gives a frontier model of " +
      params(yr.params) + " parameters (" + bytes(yr.state_bytes) + " of training state); the " +
      "largest published, " + yr.published_name + ", has " + params(yr.published_params) +
      ": " + bytes(yr.published_state_bytes) + " of training state, where the trend's GPU " +
      "holds " + bytes(yr.gpu_bytes) + ": at least " + gpus(yr.published_gpus_to_hold) +
      " just to hold it.";
  });
  const model = slider("scaling-model", d.models.map((m) => m.billions), 70, (value) => {
    const m = d.models.find((mm) => mm.billions === value);
    $("scaling-model-out").textContent = value + "B parameters: weights " +
      gb(m.weights_bytes) + ", weights + gradients + Adam " + gb(m.state_bytes) +
      " against " + gb(d.gpu_bytes) + " on one GPU: " + (m.gpus_to_hold === 1 ? "1 GPU's" : m.gpus_to_hold + " GPUs'") +
      " memory.";
  }, (v) => v + "B");
  $("scaling-check").addEventListener("click", () => {
    model.set(70);
    const m = d.models.find((mm) => mm.billions === 70);
    $("scaling-answer").textContent = "Its training state alone is " + gb(m.state_bytes) +
      ", more than an " + gb(d.gpu_bytes) + " GPU holds: it must be split over at least " +
      m.gpus_to_hold + ".";
  });
  year.update(); model.update();
  window.lab.widgets.scaling = {year, model};
})();

// ------------------------------------------------------- chapter 1: data parallelism
(function dataParallel() {
  const d = DATA.dp, box = $("dp-gpus");
  let gpus = 4;
  const setting = () => d.settings[gpusS.get() + "/" + batchS.get() + "/" + modelS.get()];
  function draw(phase) {
    const s = setting(), toy = s.toy;
    box.innerHTML = "";
    $("dp-phase").textContent = phase === 0 ? "Press Step: " + d.phases.join(" → ")
      : "Phase " + phase + "/" + d.phases.length + ": " + d.phases[phase - 1];
    for (let g = 0; g < gpus; g++) {
      const col = el("div", {class: "gpu"}, box);
      el("div", {class: "title"}, col, "GPU " + g);
      el("div", {class: "cell model" + (phase >= 1 ? " on" : "")}, col, "W (full copy)");
      el("div", {class: "cell data" + (phase >= 2 ? " on" : "")}, col,
        phase >= 2 ? "examples " + g * s.per_gpu + "–" + ((g + 1) * s.per_gpu - 1) : "—");
      el("div", {class: "cell grad" + (phase >= 3 ? " on" : "")}, col,
        phase >= 4 ? "ḡ = " + toy.averaged.toFixed(3) : phase >= 3 ? "g" + g + " = " +
        toy.local[g].toFixed(3) : "—");
      el("div", {class: "cell update" + (phase >= 5 ? " on" : "")}, col,
        phase >= 5 ? "W ← W − η ḡ" : "—");
    }
    $("dp-per-gpu").textContent = s.per_gpu;
    $("dp-memory").textContent = gb(s.memory_bytes);
    $("dp-allreduce").textContent = seconds(s.all_reduce_s);
    $("dp-grad-bytes").textContent = gb(s.grad_bytes);
    $("dp-toy").textContent = phase >= 4 ? "Averaged over GPUs: " + toy.averaged.toFixed(6) +
      "; the whole batch on one device: " + toy.full.toFixed(6) + " (the same update)." : "";
  }
  const gpusS = slider("dp-gpus-n", d.gpus, 4, (v) => { gpus = v; if (steps) steps.go(steps.index()); });
  const batchS = slider("dp-batch", d.batches, 256, () => steps && steps.go(steps.index()));
  const modelS = slider("dp-model", d.models, 7, () => steps && steps.go(steps.index()),
    (v) => v + "B");
  const steps = stepper("dp", () => d.phases.length, draw, 900);
  steps.go(0);
  $("dp-check").addEventListener("click", () => {
    gpusS.set(8); batchS.set(256);
    $("dp-answer").textContent = $("dp-per-gpu").textContent + " examples per GPU.";
  });
  window.lab.widgets.dp = {gpusS, batchS, modelS, steps};
})();

// ------------------------------------------------------------ chapter 2: ring all-reduce
(function ringAllReduce() {
  const d = DATA.ring, svg = $("ring-svg");
  let ranks = 4;
  function draw(step) {
    const ring = d.rings[String(ranks)], state = step ? ring.steps[step - 1] : null;
    const values = state ? state.values : ring.initial;
    svg.innerHTML = "";
    const cx = 170, cy = 150, r = 110, pos = (i) => [cx + r * Math.sin(2 * Math.PI * i / ranks),
      cy - r * Math.cos(2 * Math.PI * i / ranks)];
    const sent = new Set();
    if (state) for (const [src, dst, chunk] of state.sends) {
      const [x1, y1] = pos(src), [x2, y2] = pos(dst);
      el("line", {x1: x1 + (x2 - x1) * 0.2, y1: y1 + (y2 - y1) * 0.2, x2: x1 + (x2 - x1) * 0.8,
        y2: y1 + (y2 - y1) * 0.8, class: "send"}, svg);
      el("text", {x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 4, class: "sendlabel"}, svg, "c" + chunk);
      sent.add(src + "/" + chunk);
    }
    for (let i = 0; i < ranks; i++) {
      const [x0, y0] = pos(i);
      el("circle", {cx: x0, cy: y0, r: 24, class: "node"}, svg);
      el("text", {x: x0, y: y0 + 4, "text-anchor": "middle", class: "nodelabel"}, svg, "GPU " + i);
    }
    // every GPU's chunks: green once a chunk holds every GPU's contribution, outlined when
    // this step sends it
    const table = $("ring-table");
    table.innerHTML = "";
    const head = el("tr", {}, table);
    el("th", {}, head, "");
    for (let c = 0; c < ranks; c++) el("th", {}, head, "chunk " + c);
    values.forEach((row, i) => {
      const tr = el("tr", {}, table);
      el("th", {}, tr, "GPU " + i);
      row.forEach((v, c) => {
        const full = state && state.contributors[i][c].length === ranks;
        el("td", {class: "chunk" + (full ? " full" : "") + (sent.has(i + "/" + c) ? " sent" : "")},
          tr, v);
      });
    });
    $("ring-status").textContent = step === 0
      ? "Ready. " + ranks + " GPUs, " + ranks + " chunks each (GPU r holds (r+1)·10^(c mod 3) " +
        "in chunk c, so each GPU's share shows in the sums' digits)."
      : "Step " + step + "/" + ring.step_count + " (" + state.phase + "): every GPU sends one chunk" +
        " to its right neighbour" + (state.phase === "reduce-scatter" ? " and adds the one it receives."
        : " and keeps the finished one it receives.");
  }
  function times() {
    const key = (n) => n + "/" + msg.get() + "/" + bw.get();
    $("ring-time").textContent = seconds(d.times[key(ranks)]);
    $("ring-scale").textContent = d.ranks.map((n) => "N=" + n + ": " + seconds(d.times[key(n)]))
      .join(" · ");
  }
  const rankS = slider("ring-ranks", d.ranks, 4, (v) => { ranks = v; if (steps) steps.go(0); times(); });
  const msg = slider("ring-message", d.message_gb, 2, () => times(), (v) => v + " GB");
  const bw = slider("ring-bandwidth", d.bandwidth_gbps, 25, () => times(), (v) => v + " GB/s");
  const steps = stepper("ring", () => d.rings[String(ranks)].step_count, draw, 800);
  steps.go(0); times();
  $("ring-check").addEventListener("click", () => {
    msg.set(2); bw.set(25);
    const t = d.ranks.map((n) => d.times[n + "/2/25"]);
    $("ring-answer").textContent = "From 2 to 8 GPUs the time only grows from " + seconds(t[0]) +
      " to " + seconds(t[t.length - 1]) + ": each GPU sends 2(N−1)/N of the message, never more" +
      " than twice it, so the time stays near 2X/B.";
  });
  window.lab.widgets.ring = {rankS, msg, bw, steps};
})();

// ---------------------------------------------------------- chapter 3: tensor parallelism
(function tensorParallel() {
  const d = DATA.tp;
  const STAGES = ["input X on every GPU", "column-parallel up: Yᵢ = X W₁[:, slice i]",
    "GeLU on each GPU's own columns (no communication)",
    "row-parallel down: Zᵢ = GeLU(Yᵢ) W₂[slice i, :] (a partial sum)",
    "all-reduce: Z = Σᵢ Zᵢ, the one-device result"];
  const matrix = (parent, rows, title, cls) => {
    const t = el("table", {class: "matrix " + (cls || "")}, parent);
    el("caption", {}, t, title);
    const whole = rows.every((row) => row.every(Number.isInteger));
    for (const row of rows) {
      const tr = el("tr", {}, t);
      for (const v of row) {
        el("td", {}, tr, whole ? v : Math.abs(v) < 0.005 ? "0.00" : v.toFixed(2));
      }
    }
  };
  function draw(stage) {
    const tp = degree.get(), m = d.mlp[String(tp)], box = $("tp-ranks");
    box.innerHTML = "";
    $("tp-stage").textContent = stage === 0 ? "Press Step to push X through the MLP."
      : "Step " + stage + "/" + STAGES.length + ": " + STAGES[stage - 1];
    m.ranks.forEach((r, i) => {
      const gpu = el("div", {class: "gpu"}, box);
      el("div", {class: "title"}, gpu, "GPU " + i + " · d_ff " + r.columns[0] + "–" +
        (r.columns[1] - 1));
      const col = el("div", {class: "row"}, gpu);
      if (stage >= 1) matrix(col, m.x, "X");
      if (stage >= 2) matrix(col, r.hidden, "Y" + i);
      if (stage >= 3) matrix(col, r.activated, "GeLU(Y" + i + ")");
      if (stage >= 4) matrix(col, r.partial, "Z" + i + " (partial)");
    });
    const out = $("tp-out");
    out.innerHTML = "";
    if (stage >= 5) {
      matrix(out, m.reduced, "Z after all-reduce", "done");
      matrix(out, m.single, "one device: GeLU(X W₁) W₂");
      const diff = Math.max(...m.reduced.flatMap((row, i) => row.map((v, j) =>
        Math.abs(v - m.single[i][j]))));
      $("tp-diff").textContent = diff.toExponential(1);
    } else $("tp-diff").textContent = "—";
  }
  function traffic() {
    const t = d.traffic, tp = degree.get();
    $("tp-answer").textContent = "";  // an answer was for the settings it was asked at
    $("tp-count").textContent = tp === 1
      ? "TP 1: every GPU holds whole layers, so there is nothing to all-reduce"
      : t.per_layer + " all-reduces per layer (2 forward, 2 backward) × " + d.model.layers +
        " layers = " + t.per_step + " per step, " + gb(t.activation_bytes) + " each";
    $("tp-time").textContent = seconds(t.times[tp + "/" + link.get()]);
    $("tp-links").textContent = Object.keys(d.links).map((name) => name + " " +
      seconds(t.times[tp + "/" + name])).join(" · ");
  }
  const degree = slider("tp-degree", d.degrees, 2, () => { if (steps) steps.go(steps.index()); traffic(); });
  const link = slider("tp-link", Object.keys(d.links), "NVLink", traffic,
    (name) => name + " (" + d.links[name] + " GB/s each way)");
  const steps = stepper("tp", () => STAGES.length, draw, 1000);
  steps.go(0); traffic();
  $("tp-check").addEventListener("click", () => {
    // at TP 1 nothing moves: answer at the largest degree on the slider
    const t = d.traffic.times, tp = degree.get() > 1 ? degree.get() : Math.max(...d.degrees);
    $("tp-answer").textContent = "Every layer all-reduces its activations: at TP " + tp +
      " one step's " + d.traffic.per_step + " all-reduces take " + seconds(t[tp + "/NVLink"]) +
      " on NVLink but " + seconds(t[tp + "/Ethernet"]) + " on Ethernet.";
  });
  window.lab.widgets.tp = {degree, link, steps};
})();
