/* flopscope page, part 4 of 5 (before pages.js, which starts the drawing): a plan of layouts
   (flopscope plan --format html): the ranked layouts, the Pareto front of step time against peak
   memory per device, where a layout's time goes, the dropped layouts and why. */
  var PART_COLOURS = { forward: "#3b7dd8", backward: "#5aa469", recompute: "#b36bc2", tp_comm: "#e8743b",
    fsdp_comm: "#d4a017", p2p: "#c0392b", bubble: "#a8b0bd" };
  var PLAN_KEYS = ["source", "gpus", "hardware", "gpus_per_node", "global_batch", "seq_len", "dtype", "memory_budget",
    "model_flops_per_step", "time_model", "ranked", "pareto", "dropped", "roles", "simulations", "seconds", "notes", "explain"];
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
    var ranked = data.ranked || [], dropped = data.dropped || [], all = ranked.concat(dropped);
    var parts = planParts(data, all), pareto = data.pareto || [], best = ranked[0] || null;
    var bound = data.time_model || "a model of the step";
    append(root, [el("h1", { id: "subject", text: "flopscope plan: " + data.source }),
      el("p", { cls: "sub", text: data.gpus + " x " + data.hardware + " (" + data.gpus_per_node + " per node), global batch " +
        data.global_batch + " x " + data.seq_len + " tokens, " + data.dtype + ", budget " + bytes(data.memory_budget) + " per device" })]);
    var cards = [card("layouts", String(all.length), "layouts", all.length, ranked.length + " fit, " + dropped.length + " dropped")];
    if (best) cards.push(card("best layout", best.layout, "best", best.layout, "fastest that fits"),
      card("step time (" + bound + ")", secs(best.time_s.total), "step", best.time_s.total, "of " + best.layout),
      card("MFU", (100 * best.mfu).toFixed(1) + "%", "mfu", best.mfu, human(data.model_flops_per_step, "FLOP") + " of model work per step"),
      card("tokens/s per GPU", human(best.tokens_per_s_per_gpu), "tokens", best.tokens_per_s_per_gpu, ""),
      card("peak memory per GPU", bytes(best.memory_bytes), "memory", best.memory_bytes, "budget " + bytes(data.memory_budget)));
    append(root, el("div", { cls: "cards" }, cards));
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
      var r = { rank: i + 1, layout: c.layout, tp: c.tp, pp: c.pp, dp: c.dp, micro_batch: c.micro_batch, microbatches: c.microbatches,
        checkpoint: c.checkpoint, memory: c.memory_bytes, step: c.time_s.total, tokens: c.tokens_per_s_per_gpu, mfu: c.mfu,
        pareto: pareto.indexOf(c.layout) >= 0 ? "yes" : "", _cls: i === 0 ? "best" : "" };
      parts.forEach(function (p) { r["part_" + p.key] = partOf(c, p.key); });
      r._c = c;
      return r;
    });
    var cols = [{ key: "rank", label: "#", num: true }, { key: "layout", label: "layout", num: false },
      { key: "tp", label: "TP", num: true }, { key: "pp", label: "PP", num: true }, { key: "dp", label: "DP", num: true },
      { key: "micro_batch", label: "micro-batch", num: true }, { key: "microbatches", label: "micro-batches", num: true },
      { key: "checkpoint", label: "checkpointing", num: false }, { key: "memory", label: "peak/GPU", num: true, fmt: bytes },
      { key: "step", label: "step", num: true, fmt: secs, title: bound }, { key: "tokens", label: "tok/s/GPU", num: true, fmt: function (v) { return human(v); } },
      { key: "mfu", label: "MFU", num: true, fmt: share }].concat(parts.map(function (p) {
        return { key: "part_" + p.key, label: p.label, num: true, fmt: secs };
      }), [{ key: "pareto", label: "Pareto", num: false }]);
    table(rt, "ranked", cols, rows, { onRow: function (r) { select(r._c); } });
    if (dropped.length) {
      append(root, [el("h2", { text: "Dropped layouts, and why" }), dt]);
      table(dt, "dropped", [{ key: "layout", label: "layout", num: false }, { key: "memory", label: "peak/GPU", num: true, fmt: bytes },
        { key: "over", label: "over the budget by", num: true, fmt: bytes }, { key: "reason", label: "why", num: false }],
        dropped.map(function (c) { return { layout: c.layout, memory: c.memory_bytes, over: c.memory_bytes - data.memory_budget, reason: c.reason || "", _c: c }; }),
        { sort: "memory", onRow: function (r) { select(r._c); } });
    }
    if ((data.notes || []).length) append(root, [el("h2", { text: "What the figures assume" }),
      el("ul", { id: "plan-notes" }, data.notes.map(function (n) { return el("li", { text: String(n) }); }))]);
    var other = Object.keys(data).filter(function (k) { return PLAN_KEYS.indexOf(k) < 0; });
    other.forEach(function (k) {  // what this page does not know how to draw (a newer plan's keys): as JSON
      append(root, el("details", { id: "section-" + k }, [el("summary", { text: k }), el("pre", { cls: "json", text: JSON.stringify(data[k], null, 2) })]));
    });
    var dl = el("dl", { cls: "facts", id: "provenance" }), v = (about && about.versions) || {};
    [["model", data.source], ["rank roles", data.roles + " (" + data.simulations + " simulated by this plan, the rest cached)"],
     ["planned in", data.seconds === undefined ? null : data.seconds.toFixed(1) + " s"], ["time model", bound],
     ["versions", Object.keys(v).map(function (k) { return k + " " + v[k]; }).join(", ")], ["page made", about && about.created]]
      .forEach(function (f) { if (f[1] !== null && f[1] !== undefined) append(dl, [el("dt", { text: f[0] }), el("dd", { text: String(f[1]) })]); });
    append(root, [el("h2", { text: "Where these numbers come from" }), dl]);
    if (best) select(best); else if (dropped.length) select(dropped[0]);
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
