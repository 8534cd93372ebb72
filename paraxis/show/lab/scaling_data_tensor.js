// paraxis lab: chapters 0-3 (the scaling gap, data parallelism, ring all-reduce, tensor
// parallelism). Figures come from DATA; see core.js.
"use strict";

// ------------------------------------------------------------- chapter 0: scaling gap
(function scalingGap() {
  const params = (n) => n < 1e12 ? fmt(n / 1e9, 4) + "B" : n < 1e15 ? fmt(n / 1e12, 4) + "T"
    : fmt(n / 1e15, 4) + " quadrillion";
  // bytes on the axis in words (the sliders' "B" is billions of parameters)
  const bytes = (n) => {
    const units = [[1e18, "EB"], [1e15, "PB"], [1e12, "TB"], [1e9, "GB"], [1e6, "MB"]];
    const [size, name] = units.find(([u]) => n >= u) || [1, "bytes"];
    return fmt(n / size) + " " + name;
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
  const hw = d.hardware, gpuName = hw.gpu + " (the planner's default GPU)";
  $("scaling-gpu").textContent = "its 2020 point is the " + gpuName + ": " +
    gb(hw.memory_bytes) + " = " + fmt(hw.memory_gib) + " GiB";
  const year = slider("scaling-year", d.years.map((yr) => yr.year), 2020, (value) => {
    const i = d.years.findIndex((yr) => yr.year === value), yr = d.years[i];
    marker.setAttribute("x1", x(i)); marker.setAttribute("x2", x(i));
    $("scaling-year-out").textContent = value + ": the trend gives a frontier model of " +
      params(yr.params) + " parameters (" + bytes(yr.state_bytes) + " of training state); the " +
      "largest published, " + yr.published_name + ", has " + params(yr.published_params) +
      ": " + bytes(yr.published_state_bytes) + " of training state, where the trend's GPU " +
      "holds " + bytes(yr.gpu_bytes) + " (from the " + hw.gpu + "'s " + gb(hw.memory_bytes) +
      " in 2020): at least " + gpus(yr.published_gpus_to_hold) + " just to hold it (each " +
      "less the runtime's " + gb(d.reserved_bytes) + " reserve).";
  });
  const billions = (b) => (b >= 1000 ? fmt(b / 1000) + "T" : b + "B");  // 1000B reads 1T
  const model = slider("scaling-model", d.models.map((m) => m.billions), 70, (value) => {
    $("scaling-answer").textContent = "";  // an answer was for the model it was asked at
    const m = d.models.find((mm) => mm.billions === value);
    $("scaling-model-out").textContent = billions(value) + " parameters: weights " +
      gb(m.weights_bytes) + ", weights + gradients + Adam " + gb(m.state_bytes) +
      " against " + gb(d.gpu_bytes) + " on one " + gpuName + ": " +
      (m.gpus_to_hold === 1 ? "1 GPU's" : m.gpus_to_hold + " GPUs'") + " memory, each less " +
      "the runtime's " + gb(d.reserved_bytes) + " reserve.";
  }, billions);
  $("scaling-check").addEventListener("click", () => {
    model.set(70);
    const m = d.models.find((mm) => mm.billions === 70);
    $("scaling-answer").textContent = "Its training state alone is " + gb(m.state_bytes) +
      ", more than the " + gb(d.gpu_bytes) + " an " + hw.gpu + " holds: it must be split " +
      "over at least " + m.gpus_to_hold + ".";
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
        phase >= 4 ? "ḡ = " + fmt(toy.averaged, 4) : phase >= 3 ? "g" + g + " = " +
        fmt(toy.local[g], 4) : "—");
      el("div", {class: "cell update" + (phase >= 5 ? " on" : "")}, col,
        phase >= 5 ? "W ← W − η ḡ" : "—");
    }
    $("dp-per-gpu").textContent = s.per_gpu;
    $("dp-memory").textContent = gb(s.memory_bytes);
    $("dp-allreduce").textContent = gpusS.get() === 1 ? "none (one GPU)" : seconds(s.all_reduce_s);
    $("dp-grad-bytes").textContent = gb(s.grad_bytes);
    fit(s);
    $("dp-toy").textContent = phase >= 4 ? "Averaged over GPUs: " + fmt(toy.averaged, 4) +
      "; the whole batch on one device: " + fmt(toy.full, 4) + " (the same update)." : "";
  }
  // DP's hard limit: every replica holds the whole model, so more GPUs never make it fit
  function fit(s) {
    const hw = d.hardware, n = gpusS.get(), out = $("dp-fit");
    const held = gb(s.memory_bytes) + " of model states + " + gb(hw.reserved_bytes) +
      " reserved";
    out.className = s.fits ? "" : "error";
    if (s.fits) {
      out.textContent = "Fits: " + held + " within the " + gb(hw.memory_bytes) + " of one " +
        hw.gpu + "; activations come on top.";
      return;
    }
    const r = s.remedies;
    const ways = r.fitting.map((o) => o.name + " (" + gb(o.bytes) + " a GPU)");
    out.textContent = "Does not fit: " + held + " > " + gb(hw.memory_bytes) + " of one " +
      hw.gpu + ". Data parallelism alone cannot train this model on any number of these " +
      "GPUs: every replica holds all of it. " + (ways.length
      ? "On these " + n + " GPUs these would fit: " + ways.join(", ") + "."
      : (n === 1 ? "One GPU has nothing to shard over" : "On " + n + " GPUs nothing shards " +
        "enough") + ": ZeRO-3, or TP × PP splitting the model, needs at least " +
        r.least_gpus + " GPUs (" + gb(r.least_bytes) + " a GPU).");
  }
  // an answer was for the settings it was asked at: moving a control clears it
  const clear = () => { $("dp-answer").textContent = ""; };
  const gpusS = slider("dp-gpus-n", d.gpus, 4, (v) => {
    gpus = v; clear(); if (steps) steps.go(steps.index());
  });
  const batchS = slider("dp-batch", d.batches, 256, () => {
    clear(); if (steps) steps.go(steps.index());
  });
  const modelS = slider("dp-model", d.models, 7, () => steps && steps.go(steps.index()),
    (v) => v + "B");
  const steps = stepper("dp", () => d.phases.length, draw, 900);
  steps.go(0);
  const hw = d.hardware;
  $("dp-capacity").textContent = gb(hw.memory_bytes) + " on an " + hw.gpu +
    " (the planner's default GPU; " + fmt(hw.memory_gib) + " GiB)";
  $("dp-link").textContent = "NVLink at " + gb(hw.nvlink_Bps) + "/s each way (the " + hw.gpu +
    "'s, one " + hw.cluster + " node)";
  $("dp-check").addEventListener("click", () => {
    gpusS.set(8); batchS.set(256);
    $("dp-answer").textContent = $("dp-per-gpu").textContent + " examples per GPU.";
  });
  window.lab.widgets.dp = {gpusS, batchS, modelS, steps};
})();

// ------------------------------------------------------------ chapter 2: ring all-reduce
(function ringAllReduce() {
  const d = DATA.ring, svg = $("ring-svg");
  const CX = 170, CY = 150, RING = 115, NODE = 24;
  let ranks = 4;
  const pos = (i) => [CX + RING * Math.sin(2 * Math.PI * i / ranks),
    CY - RING * Math.cos(2 * Math.PI * i / ranks)];
  // One send: an arrow from circle edge to circle edge, its chunk label beside it on the
  // ring's inner side (sends go clockwise, so the inner side is the arrow's right). At N = 2
  // the two sends share a chord: each moves to its own side.
  function send(src, dst, chunk) {
    const [x1, y1] = pos(src), [x2, y2] = pos(dst);
    const length = Math.hypot(x2 - x1, y2 - y1), ux = (x2 - x1) / length, uy = (y2 - y1) / length;
    const nx = -uy, ny = ux, shift = ranks === 2 ? 7 : 0;
    el("line", {x1: x1 + ux * (NODE + 3) + nx * shift, y1: y1 + uy * (NODE + 3) + ny * shift,
      x2: x2 - ux * (NODE + 6) + nx * shift, y2: y2 - uy * (NODE + 6) + ny * shift,
      class: "send", "marker-end": "url(#arrow)"}, svg);
    el("text", {x: (x1 + x2) / 2 + nx * (shift + 15), y: (y1 + y2) / 2 + ny * (shift + 15) + 4,
      "text-anchor": "middle", class: "sendlabel"}, svg, "c" + chunk);
  }
  function draw(step) {
    const ring = d.rings[String(ranks)], state = step ? ring.steps[step - 1] : null;
    const values = state ? state.values : ring.initial;
    // the arrowhead's marker lives in the svg's defs: clear the drawing, keep the defs
    for (const node of [...svg.children]) if (node.tagName !== "defs") node.remove();
    const sent = new Set();
    if (state) for (const [src, dst, chunk] of state.sends) {
      send(src, dst, chunk);
      sent.add(src + "/" + chunk);
    }
    for (let i = 0; i < ranks; i++) {
      const [x0, y0] = pos(i);
      el("circle", {cx: x0, cy: y0, r: NODE, class: "node"}, svg);
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
    // what every chunk sums to once all-reduced: the simulator's last step
    const done = ring.steps[ring.steps.length - 1].values[0];
    $("ring-status").textContent = step === 0
      ? "Ready. " + ranks + " GPUs, " + ranks + " chunks each: GPU r holds (r+1)·10^(c mod 3) " +
        "in chunk c, so every finished chunk c holds " + (ranks === 2 ? "1+2" : "1+2+…+" + ranks) +
        " = " + done[0] +
        " times 10^(c mod 3): " + done.join(", ") + "."
      : "Step " + step + "/" + ring.step_count + " (" + state.phase + "): every GPU sends one chunk" +
        " to its right neighbour" + (state.phase === "reduce-scatter" ? " and adds the one it receives."
        : " and keeps the finished one it receives.");
  }
  function times() {
    const key = (n) => n + "/" + msg.get() + "/" + bw.get(), c = d.compared[key(ranks)];
    $("ring-time").textContent = seconds(d.times[key(ranks)]);
    $("ring-scale").textContent = d.ranks.map((n) => "N=" + n + ": " + seconds(d.times[key(n)]))
      .join(" · ");
    $("ring-naive-time").textContent = seconds(c.naive_s);
    $("ring-naive").textContent = "At N = " + ranks + ", X = " + msg.get() + " GB, B = " +
      bw.get() + " GB/s, GPU 0's link carries " + gb(c.naive_root_bytes) + "; in the ring " +
      "each GPU sends " + gb(c.ring_bytes_per_gpu) + ", all links at once (" +
      seconds(c.ring_s) + "): the ring is " + fmt(c.naive_s / c.ring_s) + "× faster, and the " +
      "gap grows with N.";
  }
  // the answer names the message and bandwidth it was asked at: moving them clears it
  const clear = () => { $("ring-answer").textContent = ""; };
  const rankS = slider("ring-ranks", d.ranks, 4, (v) => { ranks = v; if (steps) steps.go(0); times(); });
  const msg = slider("ring-message", d.message_gb, 2, () => { clear(); times(); },
    (v) => v + " GB");
  const bw = slider("ring-bandwidth", d.bandwidth_gbps, 25, () => { clear(); times(); },
    (v) => v + " GB/s");
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
  // the slice of d_ff a GPU owns, [first, end)
  const columns = ([a, b]) => b - a === 1 ? "d_ff column " + a
    : "d_ff columns " + a + "–" + (b - 1);
  function draw(stage) {
    const tp = degree.get(), m = d.mlp[String(tp)], box = $("tp-ranks");
    box.innerHTML = "";
    $("tp-stage").textContent = stage === 0 ? "Press Step to push X through the MLP."
      : "Step " + stage + "/" + STAGES.length + ": " + STAGES[stage - 1];
    m.ranks.forEach((r, i) => {
      const gpu = el("div", {class: "gpu"}, box);
      el("div", {class: "title"}, gpu, "GPU " + i + " · " + columns(r.columns));
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
      $("tp-diff").textContent = diff === 0 ? "0 (the same bits)"
        : diff < 1e-6 ? "below 0.000001 (float rounding: the sums run in another order)"
          : fmt(diff);
    } else $("tp-diff").textContent = "—";
  }
  function traffic() {
    const t = d.traffic, tp = degree.get();
    $("tp-answer").textContent = "";  // an answer was for the settings it was asked at
    $("tp-count").textContent = tp === 1
      ? "TP 1: every GPU holds whole layers, so there is nothing to all-reduce"
      : t.per_layer + " all-reduces per layer (2 forward, 2 backward) × " + d.model.layers +
        " layers = " + t.per_step + " per step, " + fmt(t.activation_bytes / 1e6) + " MB each";
    $("tp-time").textContent = seconds(t.times[tp + "/" + link.get()]);
    $("tp-compute").textContent = seconds(d.compute.times[String(tp)]);
    $("tp-links").textContent = Object.keys(d.links).map((name) => name + " " +
      seconds(t.times[tp + "/" + name])).join(" · ");
  }
  const hw = d.hardware;
  $("tp-setting").textContent = d.model.preset + "'s " + d.model.layers + " layers, " +
    d.model.seq_len + " tokens, bf16; compute at the " + hw.gpu + "'s peak " +
    fmt(hw.peak_flops / 1e12) + " TFLOP/s, links at their full rate";
  const nv = d.nvlink_Bps, rail = d.rail_Bps, each = (bps) => gb(bps) + "/s";
  const bothWays = (bps) => gb(2 * bps) + "/s", bits = (bps) => fmt(8 * bps / 1e9) + " Gb/s";
  $("tp-link-note").textContent = "Link speeds are one GPU's, one way, the rate a ring step " +
    "sends at, from the planner's presets: " + Object.keys(d.links).map((name) => name + " " +
    fmt(d.links[name]) + " GB/s (" + d.link_presets[name] + ")").join(", ") + ". Datasheets " +
    "and the course often count otherwise. NVLink's 900 GB/s is an H100's NVLink 4 counting " +
    "both directions (h100-sxm-80gb: " + bothWays(nv["h100-sxm-80gb"]) + ", " +
    each(nv["h100-sxm-80gb"]) + " each way; " + hw.gpu + ": " + bothWays(nv[hw.gpu]) + ", " +
    each(nv[hw.gpu]) + " each way). InfiniBand is rated in Gb/s (bits) per NIC, and its " +
    "generations differ: an HDR rail (" + bits(rail["dgx-a100"]) + ", dgx-a100) is " +
    each(rail["dgx-a100"]) + " each way, an NDR rail (" + bits(rail["dgx-h100"]) +
    ", dgx-h100) " + each(rail["dgx-h100"]) + "; a DGX gives each GPU one rail, so the " +
    "course's 200-400 GB/s is a node's eight rails together. PCIe Gen4 x16's 64 GB/s counts " +
    "both directions too.";
  const degree = slider("tp-degree", d.degrees, 2, () => { if (steps) steps.go(steps.index()); traffic(); });
  const link = slider("tp-link", Object.keys(d.links), "NVLink", traffic,
    (name) => name + " (" + d.links[name] + " GB/s each way)");
  const steps = stepper("tp", () => STAGES.length, draw, 1000);
  steps.go(0); traffic();
  $("tp-check").addEventListener("click", () => {
    // at TP 1 nothing moves: answer at the largest degree on the slider, shown there too
    if (degree.get() === 1) degree.set(Math.max(...d.degrees));
    const t = d.traffic.times, tp = degree.get();
    $("tp-answer").textContent = "Every layer all-reduces its activations: at TP " + tp +
      " one step's " + d.traffic.per_step + " all-reduces take " + seconds(t[tp + "/NVLink"]) +
      " on NVLink but " + seconds(t[tp + "/Ethernet"]) + " on Ethernet, against " +
      seconds(d.compute.times[String(tp)]) + " of compute for the same layers on each " +
      hw.gpu + ": on NVLink the all-reduces add " + pct(t[tp + "/NVLink"] /
      d.compute.times[String(tp)]) + " to the compute, on Ethernet " +
      fmt(t[tp + "/Ethernet"] / d.compute.times[String(tp)]) + "× the compute.";
  });
  window.lab.widgets.tp = {degree, link, steps};
})();
