/* flopscope page, part 4 of 5 (before pages.js, which starts the drawing): a plan of layouts
   (flopscope plan --format html): the ranked layouts, the Pareto front of step time against peak
   memory per device, where a layout's time goes, the dropped layouts and why; a serving plan
   ("mode": "serve"): throughput against latency per (layout, batch), prefill and decode parts. */
  var PART_COLOURS = { forward: "#3b7dd8", backward: "#5aa469", recompute: "#b36bc2", tp_comm: "#e8743b",
    fsdp_comm: "#d4a017", p2p: "#c0392b", bubble: "#a8b0bd" };
  var PLAN_KEYS = ["source", "gpus", "hardware", "gpus_per_node", "global_batch", "seq_len", "dtype", "param_dtype", "reduce_dtype", "precision", "memory_budget",
    "model_flops_per_step", "time_model", "prediction", "ranked", "pareto", "dropped", "roles", "simulations", "seconds", "notes", "explain",
    "mode", "unit", "max_new_tokens", "best_throughput", "best_latency", "best_latency_without_host",
    "best_continuous", "continuous_chunk_tokens", "batching"];
  function planParts(data, layouts) {  // the parts a step's time is made of, named as the table names them
    var names = (data.explain && data.explain.part_names) || {}, keys = Object.keys(names);
    layouts.forEach(function (c) {
      Object.keys(c.time_s || {}).forEach(function (k) {  // a part this page does not know yet
        if (keys.indexOf(k) < 0 && k !== "total" && k !== "fsdp_hidden" && typeof c.time_s[k] === "number") { keys.push(k); names[k] = k.replace(/_/g, " "); }
      });
    });
    return keys.map(function (k, i) { return { key: k, label: names[k], colour: PART_COLOURS[k] || DEPTH_COLOURS[i % DEPTH_COLOURS.length] }; });
  }
  function partOf(c, k) { var v = c.time_s && c.time_s[k]; return typeof v === "number" ? v : 0; }
  function drawPlan(root, data, about) {
    if (Array.isArray(data)) return drawSweep(root, data, about);
    if (data.mode === "serve") return drawServePlan(root, data, about);
    var ranked = data.ranked || [], dropped = data.dropped || [], all = ranked.concat(dropped);
    var unit = data.unit || "tokens";
    var parts = planParts(data, all), pareto = data.pareto || [], best = ranked[0] || null;
    var bound = data.time_model || "a model of the step", pred = data.prediction || null;
    append(root, [el("h1", { id: "subject", text: "flopscope plan: " + data.source }),
      el("p", { cls: "sub", text: "training on " + data.gpus + " x " + data.hardware + " (" + data.gpus_per_node + " per node), global batch " +
        (unit === "tokens" ? data.global_batch + " x " + data.seq_len + " tokens" : data.global_batch + " " + unit) + ", " + (data.precision || data.dtype) +
        ", budget " + bytes(data.memory_budget) + " per device" })]);
    if (pred) append(root, el("p", { cls: "hint", id: "plan-prediction", text: "Step times predicted (" + pred.source + ")" +
      (pred.error_bars && pred.error_bars.total !== undefined ? ", +-" + (100 * pred.error_bars.total).toFixed(0) + "% (90th percentile over its validation's models)" : ", no error bar") +
      "; beside them the roofline bound's step and MFU (bound): the most a layout can reach." }));
    var cards = [card("layouts", String(all.length), "layouts", all.length, ranked.length + " fit, " + dropped.length + " dropped")];
    if (best) cards.push(card("best layout", best.layout, "best", best.layout, "fastest that fits"),
      card("step time (" + bound + ")", secs(best.time_s.total), "step", best.time_s.total, "of " + best.layout),
      card("MFU", (100 * best.mfu).toFixed(1) + "%", "mfu", best.mfu, human(data.model_flops_per_step, "FLOP") + " of model work per step"),
      pred && best.mfu_bound !== undefined ? card("MFU (bound)", (100 * best.mfu_bound).toFixed(1) + "%", "mfu-bound", best.mfu_bound, "at the roofline bound's step, " + secs(best.bound_time_s.total)) : null,
      card(unit + "/s per GPU", human(best.tokens_per_s_per_gpu), "tokens", best.tokens_per_s_per_gpu, ""),
      card("peak memory per GPU", bytes(best.memory_bytes), "memory", best.memory_bytes, "budget " + bytes(data.memory_budget)));
    append(root, el("div", { cls: "cards" }, cards.filter(Boolean)));
    if (!best) append(root, el("p", { cls: "warn", id: "plan-none", text: "No layout fits the memory budget: see the dropped layouts below." }));
    var detail = el("section", { id: "breakdown" });
    function select(c) { drawBreakdown(detail, data, c, best, parts); chart.mark(c); }
    append(root, [el("h2", { text: "Step time against peak memory per GPU" }), el("p", { cls: "hint", text:
      "Every layout at its peak memory per device and its step time (" + bound + "). Filled: the Pareto front (no other layout is both faster and smaller), " +
      "joined; rings: the other layouts that fit; grey: dropped, beyond the budget line. Click a layout to see where its time goes." })]);
    var chart = paretoChart(root, data, ranked, dropped, pareto, select);
    append(root, [el("h2", { text: "Where the time goes" }), detail]);
    var rt = el("section"), dt = el("section");
    append(root, [el("h2", { text: "Layouts that fit, fastest first" }), rt]);
    var rows = ranked.map(function (c, i) {
      var r = { rank: i + 1, layout: c.layout + (c.screened ? " ~" : ""), tp: c.tp, pp: c.pp, dp: c.dp, ep: c.ep, data_parallel: c.data_parallel,
        micro_batch: c.micro_batch, microbatches: c.microbatches,
        checkpoint: c.checkpoint, memory: c.memory_bytes, step: c.time_s.total, tokens: c.tokens_per_s_per_gpu, mfu: c.mfu,
        step_bound: c.bound_time_s ? c.bound_time_s.total : null, mfu_bound: c.mfu_bound,
        pareto: pareto.indexOf(c.layout) >= 0 ? "yes" : "", _cls: i === 0 ? "best" : "" };
      parts.forEach(function (p) { r["part_" + p.key] = partOf(c, p.key); });
      r._c = c;
      return r;
    });
    var cols = [{ key: "rank", label: "#", num: true }, { key: "layout", label: "layout", num: false },
      { key: "tp", label: "TP", num: true }, { key: "pp", label: "PP", num: true }, { key: "dp", label: "DP", num: true },
      { key: "micro_batch", label: "micro-batch", num: true }, { key: "microbatches", label: "micro-batches", num: true }]
      .concat(ranked.some(function (c) { return c.ep !== undefined && c.ep !== 1; }) ? [{ key: "ep", label: "EP", num: true, title: "expert parallel" }] : [],
        ranked.some(function (c) { return c.data_parallel !== undefined; }) ? [{ key: "data_parallel", label: "data parallel", num: false }] : [], [
      { key: "checkpoint", label: "checkpointing", num: false }, { key: "memory", label: "peak/GPU", num: true, fmt: bytes },
      { key: "step", label: "step", num: true, fmt: secs, title: bound }, { key: "tokens", label: unit + "/s/GPU", num: true, fmt: function (v) { return human(v); } },
      { key: "mfu", label: "MFU", num: true, fmt: share }], pred ? [{ key: "step_bound", label: "step (bound)", num: true, fmt: secs, title: "compute at the roofline bound" },
      { key: "mfu_bound", label: "MFU (bound)", num: true, fmt: share, title: "the most the layout can reach" }] : []).concat(parts.map(function (p) {
        return { key: "part_" + p.key, label: p.label, num: true, fmt: secs };
      }), [{ key: "pareto", label: "Pareto", num: false }]);
    table(rt, "ranked", cols, rows, { onRow: function (r) { select(r._c); } });
    if (dropped.length) {
      append(root, [el("h2", { text: "Dropped layouts, and why" }), dt]);
      table(dt, "dropped", [{ key: "layout", label: "layout", num: false }, { key: "memory", label: "peak/GPU", num: true, fmt: bytes },
        { key: "over", label: "over the budget by", num: true, fmt: bytes }, { key: "reason", label: "why", num: false }],
        dropped.map(function (c) { return { layout: c.layout + (c.screened ? " ~" : ""), memory: c.memory_bytes, over: c.memory_bytes - data.memory_budget, reason: c.reason || "", _c: c }; }),
        { sort: "memory", onRow: function (r) { select(r._c); } });
    }
    planFooter(root, data, about);
    if (best) select(best); else if (dropped.length) select(dropped[0]);
  }
  function planFooter(root, data, about) {  // the notes, keys this page does not know, provenance
    if ((data.notes || []).length) append(root, [el("h2", { text: "What the figures assume" }),
      el("ul", { id: "plan-notes" }, data.notes.map(function (n) { return el("li", { text: String(n) }); }))]);
    var other = Object.keys(data).filter(function (k) { return PLAN_KEYS.indexOf(k) < 0; });
    other.forEach(function (k) {  // what this page does not know how to draw (a newer plan's keys): as JSON
      append(root, el("details", { id: "section-" + k }, [el("summary", { text: k }), el("pre", { cls: "json", text: JSON.stringify(data[k], null, 2) })]));
    });
    var dl = el("dl", { cls: "facts", id: "provenance" }), v = (about && about.versions) || {};
    [["model", data.source], ["rank roles", data.roles === undefined ? null : data.roles + " (" + data.simulations + " simulated by this plan, the rest cached)"],
     ["planned in", data.seconds === undefined ? null : data.seconds.toFixed(1) + " s"], ["time model", data.time_model],
     ["versions", Object.keys(v).map(function (k) { return k + " " + v[k]; }).join(", ")], ["page made", about && about.created]]
      .forEach(function (f) { if (f[1] !== null && f[1] !== undefined) append(dl, [el("dt", { text: f[0] }), el("dd", { text: String(f[1]) })]); });
    append(root, [el("h2", { text: "Where these numbers come from" }), dl]);
  }
  function paretoChart(root, data, ranked, dropped, pareto, onPick) {
    var W = 760, H = 380, L = 80, R = 740, T = 14, B = 330;
    var svg = sv("svg", { cls: "chart", id: "pareto", width: W, height: H, viewBox: "0 0 " + W + " " + H });
    append(root, svg);
    var all = ranked.concat(dropped);
    var xmax = Math.max.apply(null, all.map(function (c) { return c.memory_bytes; }).concat([data.memory_budget, 1])) * 1.05;
    var ymax = Math.max.apply(null, all.map(function (c) { return c.time_s.total; }).concat([1e-9])) * 1.1;
    function X(v) { return L + (R - L) * v / xmax; }
    function Y(v) { return B - (B - T) * v / ymax; }
    for (var i = 0; i <= 4; i++) {
      var gx = X(xmax * i / 4), gy = Y(ymax * i / 4);
      append(svg, [sv("line", { cls: "grid", x1: gx, x2: gx, y1: T, y2: B }), sv("text", { x: gx, y: B + 16, "text-anchor": "middle", text: bytes(xmax * i / 4) }),
        sv("line", { cls: "grid", x1: L, x2: R, y1: gy, y2: gy }), sv("text", { x: L - 6, y: gy + 4, "text-anchor": "end", text: secs(ymax * i / 4) })]);
    }
    var bx = X(data.memory_budget);
    append(svg, [sv("line", { cls: "axis", x1: L, x2: R, y1: B, y2: B }), sv("line", { cls: "axis", x1: L, x2: L, y1: T, y2: B }),
      sv("text", { x: (L + R) / 2, y: B + 34, "text-anchor": "middle", text: "peak memory per GPU" }),
      sv("text", { x: 16, y: (T + B) / 2, "text-anchor": "middle", transform: "rotate(-90 16 " + (T + B) / 2 + ")", text: "step time" }),
      sv("line", { id: "budget-line", x1: bx, x2: bx, y1: T, y2: B, stroke: "#c0392b", "stroke-dasharray": "5,4" }),
      sv("text", { x: bx - 4, y: T + 10, "text-anchor": "end", text: "budget " + bytes(data.memory_budget) })]);
    var front = ranked.filter(function (c) { return pareto.indexOf(c.layout) >= 0; }).sort(function (a, b) { return a.memory_bytes - b.memory_bytes; });
    if (front.length > 1) {  // the front as a staircase: from each layout, as fast as it at any larger memory
      var d = "M" + X(front[0].memory_bytes) + "," + Y(front[0].time_s.total);
      front.slice(1).forEach(function (c) { d += " H" + X(c.memory_bytes) + " V" + Y(c.time_s.total); });
      svg.appendChild(sv("path", { d: d, fill: "none", stroke: "var(--compute)", "stroke-width": 1.4, id: "pareto-line" }));
    }
    var marks = {};
    all.forEach(function (c) {
      var fits = ranked.indexOf(c) >= 0, onFront = pareto.indexOf(c.layout) >= 0;
      var dot = sv("circle", { cx: X(c.memory_bytes), cy: Y(c.time_s.total), r: onFront ? 5.5 : 4, "data-layout": c.layout,
        cls: fits ? (onFront ? "layout-point pareto" : "layout-point") : "dropped-point",
        fill: onFront ? "var(--compute)" : "#fff", stroke: fits ? "var(--compute)" : "#a8b0bd", "stroke-width": 1.5 });
      dot.style.cursor = "pointer";
      dot.addEventListener("click", function () { onPick(c); });
      dot.addEventListener("mousemove", function (ev) {
        showTip(ev, c.layout + (fits ? "" : " (dropped)") + "\nstep " + secs(c.time_s.total) + ", peak " + bytes(c.memory_bytes) + " per GPU" +
          "\nMFU " + (100 * c.mfu).toFixed(1) + "%, " + human(c.tokens_per_s_per_gpu) + " tokens/s per GPU" + (c.reason ? "\n" + c.reason : "") + "\nclick: where its time goes");
      });
      dot.addEventListener("mouseleave", hideTip);
      svg.appendChild(dot);
      marks[c.layout] = dot;
    });
    var ring = sv("circle", { r: 9, fill: "none", stroke: "var(--fg)", "stroke-width": 1.5, id: "pareto-selected", "pointer-events": "none" });
    var label = sv("text", { id: "pareto-selected-label", "pointer-events": "none" });
    append(svg, [ring, label]);
    return { mark: function (c) {
      var m = marks[c.layout];
      if (!m) return;
      var x = Number(m.getAttribute("cx")), y = Number(m.getAttribute("cy"));
      setAttrs(ring, { cx: x, cy: y, "data-layout": c.layout });
      setAttrs(label, { x: Math.min(x + 12, R - 120), y: y - 10, text: c.layout });
    } };
  }
  function drawBreakdown(host, data, c, best, parts) {
    host.textContent = "";
    host.setAttribute("data-layout", c.layout);
    var total = c.time_s.total || 0;
    append(host, el("h3", { id: "breakdown-title", text: c.layout + ": " + secs(total) + " per step" +
      (c === best ? " (the best layout)" : best && c.fits !== false ? " (" + (100 * (total / best.time_s.total - 1)).toFixed(0) + "% slower than " + best.layout + ")" : " (dropped)") }));
    var bar = el("div", { cls: "bar", id: "breakdown-bar" }), legend = el("div", { cls: "legend" }), rows = [];
    parts.forEach(function (p) {
      var v = partOf(c, p.key);
      if (!(v > 0)) return;
      append(bar, el("span", { style: "width:" + (100 * v / (total || 1)) + "%;background:" + p.colour, title: p.label + ": " + secs(v), "data-part": p.key, "data-value": String(v) }));
      append(legend, el("span", {}, [el("i", { style: "background:" + p.colour }), p.label + " " + secs(v) + " (" + pct(v, total) + ")"]));
      rows.push({ part: p.label, seconds: v, share: total ? v / total : null });
    });
    append(host, [bar, legend]);
    var tb = el("div");
    append(host, tb);
    table(tb, "breakdown-table", [{ key: "part", label: "part", num: false }, { key: "seconds", label: "time", num: true, fmt: secs },
      { key: "share", label: "share of the step", num: true, fmt: share }], rows, { sort: "seconds" });
    if (partOf(c, "fsdp_hidden")) append(host, el("p", { cls: "hint", text: "FSDP communication hidden behind compute (not in the step): " + secs(c.time_s.fsdp_hidden) }));
    var at = c.at_peak || {}, keys = Object.keys(at), sum = 0;
    keys.forEach(function (k) { sum += at[k]; });
    append(host, el("h3", { text: "memory at its peak: " + bytes(c.memory_bytes) + (c.peak_where ? " at " + c.peak_where : "") }));
    if (sum) {
      var mb = el("div", { cls: "bar", id: "breakdown-memory" }), ml = el("div", { cls: "legend" });
      keys.forEach(function (k) {
        append(mb, el("span", { style: "width:" + (100 * at[k] / sum) + "%;background:" + categoryColour(k), title: k + ": " + bytes(at[k]), "data-category": k }));
        append(ml, el("span", {}, [el("i", { style: "background:" + categoryColour(k) }), k.replace(/_/g, " ") + " " + bytes(at[k])]));
      });
      append(host, [mb, ml]);
    }
    if (c.reason) append(host, el("p", { cls: "warn", text: "dropped: " + c.reason }));
    var why = (data.explain && data.explain.why) || [];
    if (c === best && why.length) append(host, [el("h3", { text: "why it wins (against the next fastest, and the fastest of each other TP x PP)" }),
      el("ul", { id: "plan-why" }, why.map(function (w) { return el("li", { text: w }); }))]);
  }

  // -- a serving plan: (layout, batch) pairs by throughput, with their latency ----------------------
  var SERVE_PARTS = [{ key: "compute", label: "compute", colour: "#3b7dd8" }, { key: "tp_comm", label: "tensor-parallel collectives", colour: "#e8743b" },
    { key: "ep_comm", label: "expert all-to-alls", colour: "#16a085" }, { key: "p2p", label: "pipeline sends", colour: "#c0392b" }, { key: "host_wait", label: "waiting for the host", colour: "#8e8e8e" }];
  // a step's keys that are not parts of it (the host's time beside the device's, not added)
  var SERVE_BESIDE = ["total", "host"];
  function drawServePlan(root, data, about) {
    var ranked = data.ranked || [], dropped = data.dropped || [], bound = data.time_model || "a model of the step", pred = data.prediction || null;
    function label(c) { return c.layout + " batch " + c.batch; }
    var tput = ranked.filter(function (c) { return label(c) === data.best_throughput; })[0] || ranked[0] || null;
    var lat = ranked.filter(function (c) { return label(c) === data.best_latency; })[0] || null;
    append(root, [el("h1", { id: "subject", text: "flopscope plan: serving " + data.source }),
      el("p", { cls: "sub", text: "serving on " + data.gpus + " x " + data.hardware + " (" + data.gpus_per_node + " per node), prompts of " + data.seq_len +
        " tokens, " + data.max_new_tokens + " new tokens each, " + data.dtype + ", budget " + bytes(data.memory_budget) + " per device" +
        (data.batching ? ", " + data.batching + " batching" : "") })]);
    if (pred) append(root, el("p", { cls: "hint", id: "plan-prediction", text: "Times predicted (" + pred.source + ")" +
      (pred.error_bars && pred.error_bars.total !== undefined ? ", error bar \u00b1" + Math.round(100 * pred.error_bars.total) + "% (90th percentile of |predicted / measured - 1| over its validation's models)" : ", no error bar (not validated)") +
      (pred.validated_on ? ", " + pred.validated_on : "") + "; beside them the roofline bound's latency and tokens/s (bound): the most a layout can reach." }));
    var cards = [card("layouts x batches", String(ranked.length + dropped.length), "layouts", ranked.length + dropped.length, ranked.length + " fit, " + dropped.length + " dropped")];
    if (tput) cards.push(card("most tokens/s", label(tput), "best", label(tput), human(tput.tokens_per_s_per_gpu) + " tokens/s per GPU (" + bound + ")" +
        (tput.tokens_per_s_per_gpu_bound != null ? "; bound " + human(tput.tokens_per_s_per_gpu_bound) : "")),
      card("its latency per token", secs(tput.latency_per_token_s), "latency", tput.latency_per_token_s, "time to first token " + secs(tput.time_to_first_token_s)));
    if (lat) cards.push(card("lowest latency per token", label(lat), "best-latency", label(lat), secs(lat.latency_per_token_s) + ", " + human(lat.tokens_per_s_per_gpu) + " tokens/s per GPU" +
        (lat.host_bound ? "; host-bound: " + secs(lat.latency_per_token_without_host_s) + " at the device's time alone (CUDA graphs, torch.compile)" : "")));
    var alone = ranked.filter(function (c) { return label(c) === data.best_latency_without_host; })[0] || null;
    if (alone) cards.push(card("lowest latency without the host", label(alone), "best-latency-device", label(alone), secs(alone.latency_per_token_without_host_s) +
        " per token at the device's time alone (the host's time per call taken away)"));
    var cont = ranked.filter(function (c) { return label(c) === data.best_continuous; })[0] || null, cb = cont && cont.continuous_batching;
    if (cb) cards.push(card("most tokens/s, continuous batching", label(cont), "best-continuous", label(cont), human(cb.tokens_per_s_per_gpu) +
        " tokens/s per GPU, " + secs(cb.latency_per_token_s) + " per token (chunked prefill, " + cb.chunk_tokens + " tokens per sequence per step; static batching " +
        human(cont.tokens_per_s_per_gpu) + ")"));
    append(root, el("div", { cls: "cards" }, cards));
    if (!ranked.length) append(root, el("p", { cls: "warn", id: "plan-none", text: "No layout fits the memory budget at any batch: see the dropped ones below." }));
    var detail = el("section", { id: "breakdown" });
    append(root, [el("h2", { text: "Throughput against latency" }), el("p", { cls: "hint", text:
      "Each layout at each batch: tokens/s per GPU against the latency per token (the mean decode step; " + bound + "). Filled: the most tokens/s and the lowest latency. Click one to see where its time and memory go." })]);
    var W = 760, H = 360, L = 80, R = 740, T = 14, B = 310;
    var svg = sv("svg", { cls: "chart", id: "serve-chart", width: W, height: H, viewBox: "0 0 " + W + " " + H });
    append(root, svg);
    var xmax = Math.max.apply(null, ranked.map(function (c) { return c.tokens_per_s_per_gpu; }).concat([1e-9])) * 1.1;
    var ymax = Math.max.apply(null, ranked.map(function (c) { return c.latency_per_token_s; }).concat([1e-12])) * 1.1;
    function X(v) { return L + (R - L) * v / xmax; }
    function Y(v) { return B - (B - T) * v / ymax; }
    for (var i = 0; i <= 4; i++) {
      append(svg, [sv("line", { cls: "grid", x1: X(xmax * i / 4), x2: X(xmax * i / 4), y1: T, y2: B }), sv("text", { x: X(xmax * i / 4), y: B + 16, "text-anchor": "middle", text: human(xmax * i / 4) }),
        sv("line", { cls: "grid", x1: L, x2: R, y1: Y(ymax * i / 4), y2: Y(ymax * i / 4) }), sv("text", { x: L - 6, y: Y(ymax * i / 4) + 4, "text-anchor": "end", text: secs(ymax * i / 4) })]);
    }
    append(svg, [sv("line", { cls: "axis", x1: L, x2: R, y1: B, y2: B }), sv("line", { cls: "axis", x1: L, x2: L, y1: T, y2: B }),
      sv("text", { x: (L + R) / 2, y: B + 34, "text-anchor": "middle", text: "tokens/s per GPU" }),
      sv("text", { x: 16, y: (T + B) / 2, "text-anchor": "middle", transform: "rotate(-90 16 " + (T + B) / 2 + ")", text: "latency per token" })]);
    var ring = sv("circle", { r: 9, fill: "none", stroke: "var(--fg)", "stroke-width": 1.5, id: "serve-selected", "pointer-events": "none" });
    var marks = {};
    function select(c) {
      drawServeBreakdown(detail, data, c, tput);
      var m = marks[label(c)];
      if (m) setAttrs(ring, { cx: m.getAttribute("cx"), cy: m.getAttribute("cy"), "data-layout": label(c) });
    }
    ranked.forEach(function (c) {
      var star = c === tput || c === lat;
      var dot = sv("circle", { cx: X(c.tokens_per_s_per_gpu), cy: Y(c.latency_per_token_s), r: star ? 5.5 : 4, cls: "serve-point", "data-layout": label(c),
        fill: star ? "var(--compute)" : "#fff", stroke: "var(--compute)", "stroke-width": 1.5 });
      dot.style.cursor = "pointer";
      dot.addEventListener("click", function () { select(c); });
      dot.addEventListener("mousemove", function (ev) {
        showTip(ev, label(c) + (c.largest_batch ? " (the largest batch that fits)" : "") + "\n" + human(c.tokens_per_s_per_gpu) + " tokens/s per GPU, " +
          secs(c.latency_per_token_s) + " per token\nfirst token " + secs(c.time_to_first_token_s) + ", peak " + bytes(c.memory_bytes) + " per GPU");
      });
      dot.addEventListener("mouseleave", hideTip);
      svg.appendChild(dot);
      marks[label(c)] = dot;
    });
    svg.appendChild(ring);
    append(root, [el("h2", { text: "Where the time and memory go" }), detail]);
    var rt = el("section"), dt = el("section");
    append(root, [el("h2", { text: "Layouts and batches that fit, most tokens/s first" }), rt]);
    table(rt, "ranked", [{ key: "rank", label: "#", num: true }, { key: "layout", label: "layout", num: false },
      { key: "tp", label: "TP", num: true }, { key: "pp", label: "PP", num: true }, { key: "replicas", label: "replicas", num: true },
      { key: "batch", label: "batch", num: true }, { key: "largest", label: "largest", num: false },
      { key: "memory", label: "peak/GPU", num: true, fmt: bytes }, { key: "weights", label: "weights", num: true, fmt: bytes },
      { key: "kv", label: "KV cache", num: true, fmt: bytes }, { key: "ttft", label: "first token", num: true, fmt: secs },
      { key: "latency", label: "per token", num: true, fmt: secs, title: bound }, { key: "tps", label: "tok/s", num: true, fmt: function (v) { return human(v); } },
      { key: "tpsg", label: "tok/s/GPU", num: true, fmt: function (v) { return human(v); } }].concat(pred ? [
      { key: "latency_bound", label: "per token (bound)", num: true, fmt: secs, title: "compute at the roofline bound" },
      { key: "tpsg_bound", label: "tok/s/GPU (bound)", num: true, fmt: function (v) { return human(v); }, title: "the most the layout can reach" }] : []).concat(data.batching === "continuous" ? [] : [
      { key: "tpsg_cont", label: "tok/s/GPU (cont.)", num: true, fmt: function (v) { return v == null ? "-" : human(v); }, title: "continuous batching with chunked prefill, the same batch in its steady state" }]),
      ranked.map(function (c, i) {
        return { rank: i + 1, layout: label(c), tp: c.tp, pp: c.pp, replicas: c.replicas, batch: c.batch, largest: c.largest_batch ? "yes" : "",
          memory: c.memory_bytes, weights: c.weights_bytes, kv: c.kv_cache_bytes, ttft: c.time_to_first_token_s, latency: c.latency_per_token_s,
          tps: c.tokens_per_s, tpsg: c.tokens_per_s_per_gpu, latency_bound: c.latency_per_token_bound_s, tpsg_bound: c.tokens_per_s_per_gpu_bound,
          tpsg_cont: c.continuous_batching ? c.continuous_batching.tokens_per_s_per_gpu : null, _c: c, _cls: c === tput ? "best" : "" };
      }), { onRow: function (r) { select(r._c); } });
    if (dropped.length) {
      append(root, [el("h2", { text: "Dropped, and why" }), dt]);
      table(dt, "dropped", [{ key: "layout", label: "layout", num: false }, { key: "memory", label: "peak/GPU", num: true, fmt: bytes },
        { key: "reason", label: "why", num: false }],
        dropped.map(function (c) { return { layout: label(c), memory: c.memory_bytes, reason: c.reason || "" }; }), { sort: "memory" });
    }
    planFooter(root, data, about);
    if (tput) select(tput);
  }
  function drawServeBreakdown(host, data, c, best) {
    host.textContent = "";
    var name = c.layout + " batch " + c.batch;
    host.setAttribute("data-layout", name);
    append(host, el("h3", { id: "breakdown-title", text: name + (c === best ? " (the most tokens/s)" : "") + ": " + human(c.tokens_per_s_per_gpu) +
      " tokens/s per GPU, " + secs(c.latency_per_token_s) + " per token, first token after " + secs(c.time_to_first_token_s) }));
    var steady = data.batching === "continuous";
    [[steady ? "first token (the steps of its prompt's prefill)" : "prefill (time to first token)", c.prefill_s, "prefill"],
      [steady ? "a step (latency per token)" : "a decode step (latency per token)", c.decode_step_s, "decode"]].concat(c.continuous_batching ?
      [["a step of continuous batching (" + c.continuous_batching.chunk_tokens + " tokens per sequence)", c.continuous_batching.step_s, "continuous"]] : []).forEach(function (step) {
      var t = step[1] || {}, total = t.total || 0, bar = el("div", { cls: "bar", id: "breakdown-" + step[2] }), legend = el("div", { cls: "legend" });
      SERVE_PARTS.concat(Object.keys(t).filter(function (k) { return SERVE_BESIDE.indexOf(k) < 0 && !SERVE_PARTS.some(function (p) { return p.key === k; }); })
        .map(function (k, i) { return { key: k, label: k.replace(/_/g, " "), colour: DEPTH_COLOURS[i % DEPTH_COLOURS.length] }; })).forEach(function (p) {
        var v = t[p.key];
        if (!(v > 0)) return;
        append(bar, el("span", { style: "width:" + (100 * v / (total || 1)) + "%;background:" + p.colour, title: p.label + ": " + secs(v), "data-part": p.key, "data-value": String(v) }));
        append(legend, el("span", {}, [el("i", { style: "background:" + p.colour }), p.label + " " + secs(v) + " (" + pct(v, total) + ")"]));
      });
      append(host, [el("h3", { text: step[0] + ": " + secs(total) }), bar, legend]);
    });
    var rest = Math.max(0, c.memory_bytes - (c.weights_bytes || 0) - (c.kv_cache_bytes || 0)), parts = [["parameters", c.weights_bytes], ["kv cache", c.kv_cache_bytes], ["activations", rest]];
    var mb = el("div", { cls: "bar", id: "breakdown-memory" }), ml = el("div", { cls: "legend" });
    parts.forEach(function (p, i) {
      if (!(p[1] > 0)) return;
      var colour = i === 1 ? "#d4a017" : categoryColour(p[0]);
      append(mb, el("span", { style: "width:" + (100 * p[1] / (c.memory_bytes || 1)) + "%;background:" + colour, title: p[0] + ": " + bytes(p[1]), "data-category": p[0].replace(" ", "_") }));
      append(ml, el("span", {}, [el("i", { style: "background:" + colour }), p[0] + " " + bytes(p[1])]));
    });
    append(host, [el("h3", { text: "memory at its peak: " + bytes(c.memory_bytes) + (c.peak_where ? " at " + c.peak_where : "") }), mb, ml]);
    var why = (data.explain && data.explain.why) || [];
    if (c === best && why.length) append(host, [el("h3", { text: (data.explain && data.explain.why_title) || "why it wins" }),
      el("ul", { id: "plan-why" }, why.map(function (w) { return el("li", { text: w }); }))]);
  }

  // -- a sweep: several plans (models x GPUs x sequence lengths), one row each; a click draws one --
  function drawSweep(root, points, about) {
    append(root, [el("h1", { id: "subject", text: "flopscope plan: a sweep of " + points.length + " plans" }),
      el("p", { cls: "sub", text: "one row per model, GPU count and sequence length: its best layout; click a row for its plan" })]);
    var host = el("section"), detail = el("section", { id: "sweep-plan" });
    append(root, host);
    table(host, "sweep", [{ key: "source", label: "model", num: false }, { key: "gpus", label: "GPUs", num: true },
      { key: "seq_len", label: "seq len", num: true }, { key: "best", label: "best layout", num: false },
      { key: "step", label: "step / per token", num: true, fmt: secs }, { key: "mfu", label: "MFU", num: true, fmt: share },
      { key: "rate", label: "tokens/s per GPU", num: true, fmt: function (v) { return human(v); } },
      { key: "fit", label: "fit", num: false }, { key: "error", label: "error", num: false }],
      points.map(function (p) {
        var plan = p.plan || {}, serve = plan.mode === "serve", best = (plan.ranked || [])[0];
        return { source: p.source, gpus: p.gpus, seq_len: p.seq_len, error: p.error || "", _p: p,
          best: best ? best.layout + (serve ? " batch " + best.batch : "") : "-",
          step: best ? (serve ? best.latency_per_token_s : best.time_s.total) : null, mfu: best && !serve ? best.mfu : null,
          rate: best ? best.tokens_per_s_per_gpu : null,
          fit: plan.ranked ? plan.ranked.length + " of " + (plan.ranked.length + (plan.dropped || []).length) : "" };
      }), { onRow: function (r) { show(r._p); } });
    append(root, detail);
    function show(p) {
      detail.textContent = "";
      detail.setAttribute("data-point", p.source + " " + p.gpus + " " + p.seq_len);
      if (p.plan) drawPlan(detail, p.plan, about);
      else append(detail, el("p", { cls: "warn", text: p.source + " on " + p.gpus + " GPUs: " + (p.error || "no plan") }));
    }
    var first = points.filter(function (p) { return p.plan; })[0];
    if (first) show(first);
  }
