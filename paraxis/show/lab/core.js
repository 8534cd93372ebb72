// paraxis lab: shared helpers and the page's pure functions.
// Every figure the widgets print is read from DATA (computed by the paraxis library when the
// page was written) or computed by the pure functions below, which tests/test_lab.py runs
// over every slider setting and compares with the library.
"use strict";
const DATA = JSON.parse(document.getElementById("lab-data").textContent);
const SVGNS = "http://www.w3.org/2000/svg";
const COLOURS = {F: "#2a9d8f", B: "#e76f51", W: "#8e6cc0", idle: "#e9ecef",
  tp: "#2f9e44", pp: "#f08c00", dp: "#1c7ed6", cp: "#ae3ec9", ep: "#c92a2a"};

function $(id) { return document.getElementById(id); }

function el(tag, attrs, parent, text) {
  const svg = ["svg", "rect", "line", "text", "circle", "path", "g", "polyline"].includes(tag);
  const node = svg ? document.createElementNS(SVGNS, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

// A slider over a list of values: the range input moves over indices, the label shows the
// value. onChange(value) runs on every input event (what the browser test dispatches).
function slider(id, values, initial, onChange, format) {
  const input = $(id);
  const shown = $(id + "-value");
  input.min = 0; input.max = values.length - 1; input.step = 1;
  input.value = Math.max(0, values.indexOf(initial));
  const update = () => {
    const value = values[Number(input.value)];
    if (shown) shown.textContent = format ? format(value) : String(value);
    onChange(value);
  };
  input.addEventListener("input", update);
  if (shown) shown.textContent = format ? format(values[Number(input.value)]) : String(initial);
  return {get: () => values[Number(input.value)], update,
    set: (value) => { input.value = values.indexOf(value); update(); }};
}

// A number as people write it: `digits` significant digits (3 unless given), never an
// exponent, no trailing zeros after the point ("0.14", "26.3", "1120", "0.000512").
// Rounding to significant digits never decreases a larger number below a smaller one, so
// "used of capacity" printed with the same digits never shows used above a capacity it fits.
function fmt(x, digits) {
  const d = digits || 3;
  if (!Number.isFinite(x) || x === 0) return String(x);
  const magnitude = Math.floor(Math.log10(Math.abs(x)));
  const decimals = Math.max(0, d - 1 - magnitude);
  const unit = 10 ** (magnitude - d + 1);
  const text = decimals ? x.toFixed(decimals) : String(Math.round(x / unit) * unit);
  return text.includes(".") ? text.replace(/\.?0+$/, "") : text;
}
function gb(bytes) { return fmt(bytes / 1e9, 4) + " GB"; }
function pct(x) { return (100 * x).toFixed(1) + "%"; }
function seconds(s) { return s >= 0.1 ? fmt(s) + " s" : fmt(s * 1e3) + " ms"; }
function gcd(a, b) { while (b) [a, b] = [b, a % b]; return a; }

// A step-through animation: `steps` states, show(i) draws state i (0 = before step 1).
function stepper(prefix, count, show, intervalMs) {
  let index = 0, timer = null;
  const stop = () => { if (timer) clearInterval(timer); timer = null; };
  const go = (i) => { index = Math.max(0, Math.min(count(), i)); show(index); };
  $(prefix + "-step").addEventListener("click", () => { stop(); go(index + 1); });
  $(prefix + "-reset").addEventListener("click", () => { stop(); go(0); });
  $(prefix + "-play").addEventListener("click", () => {
    stop(); go(0);
    timer = setInterval(() => { if (index >= count()) stop(); else go(index + 1); },
      intervalMs || 700);
  });
  return {go, stop, index: () => index};
}

// ------------------------------------------------------------ pipeline: pure functions

function virtualStageOf(stage, chunk, stages, placement) {
  if (placement === "v") return chunk === 0 ? stage : 2 * stages - 1 - stage;
  return chunk * stages + stage;
}

function placeOf(vs, stages, placement) {
  if (placement === "v") return vs < stages ? [vs, 0] : [2 * stages - 1 - vs, 1];
  return [vs % stages, Math.floor(vs / stages)];
}

// Run each stage's compute order against a clock, as paraxis.spec.schedules.simulate does with
// no message cost: a compute starts when its stage is free and, if its input comes from
// another stage, when the compute producing it has ended. Costs per stage (forward and whole
// backward) are split evenly over the stage's v chunks; a split backward's W is half of it.
function simulate(entry, stages, forward, backward) {
  const v = entry.virtual, placement = entry.placement, orders = entry.orders;
  const last = stages * v - 1;
  const split = orders.some((o) => o.some((n, i) => i % 3 === 0 && n === 2));
  const done = new Map();
  const clocks = new Array(stages).fill(0), pos = new Array(stages).fill(0);
  const events = orders.map(() => []);
  let remaining = orders.reduce((s, o) => s + o.length / 3, 0);
  while (remaining) {
    let progressed = false;
    for (let s = 0; s < stages; s++) {
      const o = orders[s];
      while (pos[s] < o.length / 3) {
        const kind = o[3 * pos[s]], mb = o[3 * pos[s] + 1], chunk = o[3 * pos[s] + 2];
        const here = virtualStageOf(s, chunk, stages, placement);
        let start = clocks[s];
        if (kind !== 2) {
          const source = kind === 0 ? here - 1 : here + 1;
          if (source >= 0 && source <= last && placeOf(source, stages, placement)[0] !== s) {
            const key = kind + "/" + mb + "/" + source;
            if (!done.has(key)) break;
            start = Math.max(start, done.get(key));
          }
        }
        const whole = backward[s] / v;
        const cost = kind === 0 ? forward[s] / v : kind === 2 ? whole / 2
          : split ? whole - whole / 2 : whole;
        const end = start + cost;
        done.set(kind + "/" + mb + "/" + here, end);
        events[s].push([start, end, kind, mb, chunk]);
        clocks[s] = end; pos[s]++; remaining--; progressed = true;
      }
    }
    if (!progressed) throw new Error("schedule deadlocks");
  }
  const makespan = Math.max(...events.map((e) => e.length ? e[e.length - 1][1] : 0));
  const busy = events.reduce((t, e) => t + e.reduce((u, x) => u + x[1] - x[0], 0), 0);
  const total = stages * makespan;
  const bubble = total ? (total - busy) / total : 0;
  // Every cost is a whole number of 1/(2v) units (whole factors, a backward split in halves),
  // so idle / total is a ratio of integers: print it exactly.
  const unit = 2 * v, idleU = Math.round((total - busy) * unit), totalU = Math.round(total * unit);
  const g = gcd(idleU, totalU) || 1;
  return {events, makespan, bubble, fraction: (idleU / g) + "/" + (totalU / g),
    peak: peakInFlight(orders, split)};
}

// Activations held per stage: +1 at each forward, -1 when the backward that frees them ends
// (W when the backward is split), as Schedule.peak_in_flight counts.
function peakInFlight(orders, split) {
  const release = split ? 2 : 1;
  return orders.map((o) => {
    let held = 0, peak = 0;
    for (let i = 0; i < o.length; i += 3) {
      if (o[i] === 0) { held++; peak = Math.max(peak, held); } else if (o[i] === release) held--;
    }
    return peak;
  });
}

function stageCosts(stages, slowStage) {
  const p = DATA.pipeline;
  const scale = Array.from({length: stages}, (_, s) => (s === slowStage ? p.slow_factor : 1));
  return [scale.map((x) => p.forward_cost * x), scale.map((x) => p.backward_cost * x)];
}

// Every setting of the pipeline controls through `simulate`: what the browser test
// compares. Events come back as one flat list of start, end per schedule (compact).
function pipelineAll(settings) {
  return settings.map(([kind, stages, mb, v, slow]) => {
    const entry = DATA.pipeline.orders[kind + "/" + stages + "/" + mb + "/" + v];
    const [f, b] = stageCosts(stages, slow);
    const r = simulate(entry, stages, f, b);
    return {events: r.events.flatMap((e) => e.flatMap((x) => [x[0], x[1]])),
      makespan: r.makespan, bubble: r.bubble, fraction: r.fraction, peak: r.peak};
  });
}

window.lab = {DATA, simulate, peakInFlight, pipelineAll, widgets: {}};
