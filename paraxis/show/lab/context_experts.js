// paraxis lab: beyond the course, context parallelism and mixtures of experts. Figures come
// from DATA (context_facts.py, expert_facts.py); see core.js.
"use strict";

function bytesText(b) {
  const [scale, unit] = b >= 1e9 ? [1e9, "GB"] : b >= 1e6 ? [1e6, "MB"] : [1e3, "kB"];
  return fmt(b / scale) + " " + unit;
}
function pairsText(n) {
  return n >= 1e9 ? fmt(n / 1e9) + " bn" : fmt(n / 1e6) + " M";
}
function rankColour(colours, rank) { return colours[rank % colours.length]; }

// ------------------------------------------------------------ context parallelism
(function context() {
  const d = DATA.context, matrix = $("cp-matrix"), sequence = $("cp-sequence");
  const NAMES = {ring: "ring", all_gather: "all-gather", all_to_all: "all-to-all"};
  const colour = (rank) => rankColour(d.colours, rank);
  const setting = () => d.settings[String(cpS.get())];
  const count = () => (variantS.get() === "ring" ? cpS.get() : 1);

  function drawSequence(s) {
    const n = 2 * cpS.get(), width = 540 / n;
    sequence.innerHTML = "";
    s.chunks.forEach((chunks, rank) => chunks.forEach((c) => {
      el("rect", {x: c * width, y: 16, width: width - 1, height: 30, fill: colour(rank),
        id: "cp-chunk-" + c, "data-rank": rank}, sequence);
      el("text", {x: c * width + width / 2, y: 12, "text-anchor": "middle", class: "tick"},
        sequence, String(c));
      el("text", {x: c * width + width / 2, y: 35, "text-anchor": "middle", class: "blocklabel"},
        sequence, "r" + rank);
    }));
  }

  function drawMatrix(s, variant, index) {
    const n = 2 * cpS.get(), size = 300 / n, left = 26, top = 18;
    // narrow blocks take smaller labels, so that "k10" and "k11" stay apart
    const tick = size < 24 ? {class: "tick", style: "font-size: 9px"}
      : {class: "tick"};
    matrix.innerHTML = "";
    for (let c = 0; c < n; c++) {
      el("text", {...tick, x: left + c * size + size / 2, y: 12, "text-anchor": "middle"},
        matrix, "k" + c);
      el("text", {...tick, x: 0, y: top + c * size + size / 2 + 4}, matrix, "q" + c);
    }
    for (const [q, k, rank, step, half] of s.cells[variant]) {
      const shown = variant === "ring" ? step < index : index >= 1;
      const x = left + k * size, y = top + q * size, side = size - 1;
      const attrs = {fill: rank === null ? "#868e96" : colour(rank), opacity: shown ? 1 : 0.15,
        id: "cp-cell-" + q + "-" + k, "data-rank": rank === null ? "all" : rank,
        "data-shown": shown};
      if (half) {  // causal inside the diagonal block: its lower triangle
        el("path", {...attrs, d: `M${x},${y} L${x},${y + side} L${x + side},${y + side} Z`},
          matrix);
      } else {
        el("rect", {...attrs, x, y, width: side, height: side}, matrix);
      }
      if (shown && size >= 24) {
        el("text", {x: x + (half ? size / 3 : size / 2), y: y + (half ? 0.75 : 0.5) * size + 4,
          "text-anchor": "middle", class: "blocklabel"}, matrix,
          variant === "ring" ? "s" + step : rank === null ? "all" : "r" + rank);
      }
    }
  }

  function describe(s, variant, index) {
    const cp = cpS.get(), lines = [];
    if (index === 0) {
      $("cp-phase").textContent = "Before attention: every rank holds q, k and v of its two " +
        "chunks only.";
    } else if (variant === "ring") {
      $("cp-phase").textContent = "Ring step " + (index - 1) + " (of 0 to " + (cp - 1) +
        "): each rank computes against the K/V it holds while passing them one rank on " +
        "(no pass after the last step).";
      s.steps[index - 1].forEach((r, rank) => lines.push("rank " + rank + ": K/V of rank " +
        r.source + " (chunks " + s.chunks[r.source].join(",") + ") → " +
        r.blocks.replace(/\n/g, ", ")));
    } else if (variant === "all_gather") {
      $("cp-phase").textContent = "All-gather: every rank receives every chunk's K/V at " +
        "once, then computes its own query chunks against them (the same blocks as the ring).";
    } else {
      $("cp-phase").textContent = "All-to-all: each rank trades its chunks of q, k, v for " +
        "1/" + cp + " of the heads over the whole sequence, runs one causal call (grey: every " +
        "rank, each for its heads), and a second all-to-all brings the output back.";
    }
    $("cp-ranks").textContent = lines.join("\n");
  }

  function drawCosts(s) {
    const c = s.costs[String(seqS.get())], svg = $("cp-pairs"), cp = cpS.get();
    const most = Math.max(...c.contiguous), bar = 840 / (3 * cp);
    const mean = c.contiguous.reduce((a, b) => a + b, 0) / cp;
    svg.innerHTML = "";
    for (let rank = 0; rank < cp; rank++) {
      [["zigzag", 1], ["contiguous", 0.4]].forEach(([kind, opacity], i) => {
        const h = 105 * c[kind][rank] / most, x = 40 + rank * 3 * bar + i * bar;
        el("rect", {x, y: 130 - h, width: bar - 2, height: h, fill: colour(rank), opacity,
          id: "cp-pairs-" + kind + "-" + rank}, svg);
        // narrow bars take smaller labels, so that neighbours' labels stay apart
        el("text", {x: x + bar / 2, y: 126 - h, "text-anchor": "middle", class: "tick",
          style: bar < 44 ? "font-size: 9px" : ""}, svg, pairsText(c[kind][rank]));
      });
      el("text", {x: 40 + rank * 3 * bar + bar, y: 146, "text-anchor": "middle", class: "tick"},
        svg, "rank " + rank);
    }
    el("text", {x: 0, y: 162, class: "tick"}, svg, "solid: zig-zag · pale: contiguous pieces");
    $("cp-balanced").textContent = c.zigzag.every((p) => p === c.zigzag[0])
      ? pairsText(c.zigzag[0]) + " on every rank" : c.zigzag.map(pairsText).join(" ");
    $("cp-lopsided").textContent = (Math.max(...c.contiguous) / mean).toFixed(2) + "x";
    const table = $("cp-table");
    table.innerHTML = "";
    el("caption", {}, table, "Per rank, one layer's attention core: Llama 3 8B's (" +
      d.shape.heads +
      " heads, " + d.shape.kv_heads + " K/V heads of " + d.shape.head_dim + "), " +
      seqS.get() / 1024 + "K tokens, bf16; one device keeps " +
      bytesText(c.one_device_saved) + ".");
    const head = el("tr", {}, table);
    for (const h of ["K/V moved by", "leaves the rank, forward", "backward",
      "kept for backward"])
      el("th", {}, head, h);
    for (const v of d.variants) {
      const row = el("tr", {id: "cp-row-" + v, class: v === variantS.get() ? "chosen" : ""},
        table);
      for (const t of [NAMES[v], bytesText(c.sent[v][0]), bytesText(c.sent[v][1]),
        bytesText(c.saved[v])]) el("td", {}, row, t);
    }
  }

  function show(index) {
    const s = setting(), variant = variantS.get();
    drawSequence(s);
    drawMatrix(s, variant, index);
    describe(s, variant, index);
    drawCosts(s);
  }
  const animation = stepper("cp", count, show, 900);
  const redraw = () => {
    $("cp-answer").textContent = "";  // an answer was for the settings it was asked at
    animation.stop(); animation.go(count());
  };
  const cpS = slider("cp-degree", d.cp, 4, redraw);
  const variantS = slider("cp-variant", d.variants, "ring", redraw, (v) => NAMES[v]);
  const seqS = slider("cp-seq", d.seq_lens, 131072, redraw, (n) => n / 1024 + "K");
  redraw();
  $("cp-check").addEventListener("click", () => {
    cpS.set(4); variantS.set("ring"); animation.go(3);
    const s = setting(), step = s.steps[2][0];
    $("cp-answer").textContent = "Rank 0 holds chunks " + s.chunks[0].join(" and ") + " of " +
      2 * cpS.get() + ": an early chunk with little causal work and a late one with much. At " +
      "ring step 2 it holds rank " + step.source + "'s K/V (chunks " +
      s.chunks[step.source].join(",") + ") and computes " + step.blocks.replace(/\n/g, ", ") +
      ": its late query chunk against both, its early one against neither.";
  });
  window.lab.widgets.context = {cpS, variantS, seqS, animation};
})();

// ------------------------------------------------------------ mixture of experts
(function experts() {
  // dropped assignments: an empty box with a dashed outline, unlike every rank's colour
  const d = DATA.experts, bars = $("moe-bars"), DROPPED = "#495057";
  const colour = (rank) => rankColour(d.colours, rank);
  const entry = () => d.settings[blockS.get() + "/" + epS.get() + "/" + cfS.get()];
  const sum = (xs) => xs.reduce((a, b) => a + b, 0);
  // per expert, over the ranks: for drawing the bars
  const perExpert = (counts) => Array.from({length: d.n_experts},
    (_, x) => sum(counts.map((row) => row[x])));

  function drawBars(e) {
    const E = d.n_experts, width = 460 / E, routed = perExpert(e.routed);
    const scale = 190 / Math.max(...routed);
    bars.innerHTML = "";
    for (let x = 0; x < E; x++) {
      let y = 210;
      e.kept.forEach((row, rank) => {
        const h = row[x] * scale;
        y -= h;
        el("rect", {x: 40 + x * width, y, width: width - 4, height: h, fill: colour(rank),
          id: "moe-bar-" + x + "-" + rank}, bars);
      });
      const dropped = routed[x] - perExpert(e.kept)[x];
      if (dropped) el("rect", {x: 40 + x * width + 0.75, y: y - dropped * scale + 0.75,
        width: width - 5.5, height: Math.max(0, dropped * scale - 1.5), fill: "#fff", stroke: DROPPED,
        "stroke-width": 1.5, "stroke-dasharray": "4 2", id: "moe-drop-" + x}, bars);
      el("text", {x: 40 + x * width + width / 2 - 2, y: 222, "text-anchor": "middle",
        class: "tick"}, bars, "e" + x);
    }
    e.owners.forEach((experts, rank) => el("text", {x: 40 + (experts[0] + experts.length / 2)
      * width - 2, y: 240, "text-anchor": "middle", class: "tick"}, bars, "on rank " + rank));
    const mean = 210 - sum(routed) / E * scale;
    el("line", {x1: 36, x2: 40 + E * width, y1: mean, y2: mean, stroke: "#212529",
      "stroke-dasharray": "2 3"}, bars);
    el("text", {x: 0, y: mean + 4, class: "tick"}, bars, "mean");
  }

  // dark text on a light colour (yellow, sky, orange), white on a dark one: the sRGB
  // luminance decides, so every chip stays readable
  function textOn(hex) {
    const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16) / 255);
    return 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 ? "#212529" : "#fff";
  }

  // what the bars' colours mean, for the ranks of this setting
  function drawLegend() {
    const legend = $("moe-legend");
    legend.innerHTML = "";
    for (let rank = 0; rank < epS.get(); rank++) {
      el("span", {id: "moe-legend-" + rank, "data-colour": colour(rank),
        style: "background:" + colour(rank) + "; color:" + textOn(colour(rank))}, legend,
        "rank " + rank + "'s tokens");
    }
    el("span", {id: "moe-legend-dropped", style: "background: #fff; color: " + DROPPED +
      "; border: 1.5px dashed " + DROPPED}, legend, "dropped: over the capacity");
    legend.append("dotted line: the mean expert's assignments");
  }

  function drawSends(e) {
    const table = $("moe-sends"), ep = epS.get();
    table.innerHTML = "";
    el("caption", {}, table, "assignments sent, from rank (row) to rank (column)");
    const head = el("tr", {}, table);
    el("th", {}, head, "");
    for (let j = 0; j < ep; j++) el("th", {}, head, "→ " + j);
    e.sends.forEach((row, i) => {
      const tr = el("tr", {}, table);
      el("th", {}, tr, "rank " + i);
      row.forEach((n, j) => el("td", {id: "moe-send-" + i + "-" + j, style: i === j
        ? "color:#adb5bd" : ""}, tr, String(n)));
    });
  }

  function draw() {
    const e = entry(), routed = sum(e.routed.flat()), dropped = routed - sum(e.kept.flat());
    $("moe-model").textContent = d.model + " at its initial weights: " + d.n_experts +
      " experts, top " + d.top_k + ", " + d.tokens + " tokens of the embedded corpus (" +
      d.tokens * d.top_k + " assignments) split over " + epS.get() + (epS.get() === 1 ? " rank" : " ranks") +
      "; capacity " +
      (e.capacity === null ? "none (dropless)" : e.capacity + " assignments per expert " +
      "of each rank's own tokens");
    drawBars(e);
    drawLegend();
    drawSends(e);
    $("moe-expert-load").textContent = e.expert_load.toFixed(2) + "x (expert " +
      e.busiest_expert + ")";
    $("moe-rank-load").textContent = e.rank_load.toFixed(2) + "x (rank " + e.busiest_rank + ")";
    $("moe-dropped").textContent = dropped + " of " + routed + " assignments (" +
      pct(dropped / routed) + ")";
    $("moe-bytes").textContent = e.sent_bytes.map(bytesText).join(" · ") + " (d_model " +
      d.d_model + ", fp32)";
    $("moe-uniform").textContent = bytesText(e.uniform_sent_bytes) + " each";
  }
  const redraw = () => {
    $("moe-answer").textContent = "";  // an answer was for the settings it was asked at
    draw();
  };
  const blockS = slider("moe-block", d.blocks, d.blocks[0], redraw);
  const epS = slider("moe-ep", d.ep, 4, redraw);
  const cfS = slider("moe-cf", d.capacity_factors, 0, redraw,
    (cf) => (cf ? String(cf) : "none"));
  draw();
  $("moe-check").addEventListener("click", () => {
    blockS.set(d.blocks[0]); epS.set(4); cfS.set(0);
    const e = entry();
    $("moe-answer").textContent = "Under uniform routing 1/ep of a rank's assignments stay on " +
      "it: (ep − 1)/ep = " + pct(e.uniform_leave_share) + " leave at ep = 4; this router " +
      "sends " + pct(e.leave_share) + ". Its busiest expert (" + e.busiest_expert + ") gets " +
      e.expert_load.toFixed(2) + "x the mean; the busiest rank (" + e.busiest_rank + ") " +
      "computes " + e.rank_load.toFixed(2) + "x the mean rank's work, and every rank waits " +
      "for it at the all-to-all that brings the outputs back.";
  });
  window.lab.widgets.experts = {blockS, epS, cfS};
})();
