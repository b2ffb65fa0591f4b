/* flopscope page, part 2 of 5: the roofline, memory, and the page of one report. */
  // -- the roofline chart ---------------------------------------------------------------------------
  // Operators at their arithmetic intensity and FLOP rate under the roofs of the report's hardware:
  // the estimate's rates (filled) where the report has an estimate, measured rates (from profile),
  // and beside each measured operator its bound and predicted rates where the section has them.
  function roofline(host, rep) {
    var est = rep.estimate, mes = rep.measured;
    var hw = est ? est.hardware : mes.peaks, bw = hw.memory_bandwidth_gb_s * 1e9;
    var pts = est ? Object.keys(est.by_op).map(function (op) {
      var r = est.by_op[op];
      return { op: op, x: r.intensity, y: r.time_s ? r.flops / r.time_s : 0, r: r };
    }).filter(function (p) { return p.x && p.y && p.r.bytes; }) : [];
    var measured = [], bounds = [], predicted = [], measuredTotal = 0;
    if (est) Object.keys(est.by_op).forEach(function (op) {  // a calibrated estimate's prediction
      var r = est.by_op[op];
      if (r.predicted_s && r.flops && r.bytes) predicted.push({ op: op, x: r.flops / r.bytes, y: r.flops / r.predicted_s, s: r.predicted_s });
    });
    if (mes && mes.by_op) Object.keys(mes.by_op).forEach(function (op) {
      var r = mes.by_op[op];
      if (!r.flops || !r.bytes) return;
      var x = r.flops / r.bytes;
      if (r.seconds) { measured.push({ op: op, x: x, y: r.flops / r.seconds, r: r }); measuredTotal += r.seconds; }
      if (est) return;  // the estimate's points are the bounds
      if (r.bound_s) bounds.push({ op: op, x: x, y: r.flops / r.bound_s, s: r.bound_s });
      if (r.predicted_s) predicted.push({ op: op, x: x, y: r.flops / r.predicted_s, s: r.predicted_s });
    });
    var dtypes = Object.keys(Object.assign({}, hw.vector_tflops || {}, hw.matrix_tflops || {}));
    var pick = dtypes.indexOf("fp32") >= 0 ? "fp32" : dtypes.indexOf("bf16") >= 0 ? "bf16" : dtypes[0];
    var select = el("select", { id: "roofline-dtype", "aria-label": "roofs of" },
      dtypes.map(function (d) { return el("option", { value: d, text: d, selected: d === pick ? "selected" : null }); }));
    var svg = sv("svg", { cls: "chart", id: "roofline", width: 760, height: 440, viewBox: "0 0 760 440" });
    var what = est ? "Each operator at its arithmetic intensity and the FLOP rate the estimate gives it " +
      "(a bound: real kernels are slower); area by its share of the estimated time." +
      (measured.length ? " Red rings: measured rates." : "")
      : "Each operator at its arithmetic intensity and the FLOP rate measured (" + mes.device + ", median of " + mes.repeat +
      " runs); area by its share of the measured time." + (bounds.length ? " Grey crosses: the rate of its roofline bound, joined to it." : "");
    append(host, [el("p", { cls: "hint", text: what + (predicted.length ? " Purple squares: the calibrated prediction's rate." : "") +
      " Roofs: the memory bandwidth (" + human(bw, "B/s") + ") and the peaks of the chosen data type on " + hw.name +
      (hw.measured ? " (measured)." : " (datasheet).") }),
      el("div", { cls: "controls" }, [el("label", { text: "roofs of" }), select]), svg]);
    select.addEventListener("change", draw);
    function draw() {
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      var d = select.value;
      // float32 products (est.tf32) or convolutions (est.tf32_convolution, cuDNN's default) that
      // the estimate took as TF32 run under the TF32 matrix roof
      var asTf32 = est && d === "fp32" && (est.tf32 || est.tf32_convolution) && hw.matrix_tflops && hw.matrix_tflops.tf32;
      var tf = asTf32 ? "tf32" : d;
      var roofs = [];
      if (hw.matrix_tflops && hw.matrix_tflops[tf]) roofs.push({ peak: hw.matrix_tflops[tf] * 1e12, dash: null,
        label: tf + " matrix" + (asTf32 && !est.tf32 ? " (convolutions)" : asTf32 && !est.tf32_convolution ? " (products)" : "") });
      if (hw.vector_tflops && hw.vector_tflops[d]) roofs.push({ label: d + " vector", peak: hw.vector_tflops[d] * 1e12, dash: "5,4" });
      var all = pts.concat(measured, bounds, predicted);
      var xs = all.map(function (p) { return p.x; }).concat(roofs.map(function (r) { return r.peak / bw; }));
      var ys = all.map(function (p) { return p.y; }).concat(roofs.map(function (r) { return r.peak; }));
      var x0 = Math.pow(10, Math.floor(Math.log10(Math.min.apply(null, xs.concat([1])) / 2)));
      var x1 = Math.pow(10, Math.ceil(Math.log10(Math.max.apply(null, xs.concat([100])) * 2)));
      var y0 = Math.pow(10, Math.floor(Math.log10(Math.min.apply(null, ys.concat([bw * x0])) / 2)));
      var y1 = Math.pow(10, Math.ceil(Math.log10(Math.max.apply(null, ys) * 1.5)));
      var L = 70, R = 740, T = 14, B = 400;
      function X(v) { return L + (R - L) * (Math.log10(v) - Math.log10(x0)) / (Math.log10(x1) - Math.log10(x0)); }
      function Y(v) { return B - (B - T) * (Math.log10(v) - Math.log10(y0)) / (Math.log10(y1) - Math.log10(y0)); }
      for (var e = Math.log10(x0); e <= Math.log10(x1) + 1e-9; e++) {
        var gx = X(Math.pow(10, e));
        append(svg, [sv("line", { cls: "grid", x1: gx, x2: gx, y1: T, y2: B }),
          sv("text", { x: gx, y: B + 16, "text-anchor": "middle", text: human(Math.pow(10, e)) })]);
      }
      for (e = Math.log10(y0); e <= Math.log10(y1) + 1e-9; e++) {
        var gy = Y(Math.pow(10, e));
        append(svg, [sv("line", { cls: "grid", x1: L, x2: R, y1: gy, y2: gy }),
          sv("text", { x: L - 6, y: gy + 4, "text-anchor": "end", text: human(Math.pow(10, e)) })]);
      }
      append(svg, [sv("line", { cls: "axis", x1: L, x2: R, y1: B, y2: B }), sv("line", { cls: "axis", x1: L, x2: L, y1: T, y2: B }),
        sv("text", { x: (L + R) / 2, y: B + 34, "text-anchor": "middle", text: "arithmetic intensity (FLOP / byte)" }),
        sv("text", { x: 14, y: (T + B) / 2, "text-anchor": "middle", transform: "rotate(-90 14 " + (T + B) / 2 + ")", text: "FLOP/s" })]);
      roofs.forEach(function (r, i) {  // the roof, and its name in a key at the top left
        var ridge = r.peak / bw, path = "M" + X(x0) + "," + Y(bw * x0) + " L" + X(ridge) + "," + Y(r.peak) + " L" + X(x1) + "," + Y(r.peak);
        var colour = i ? "#7a8699" : "#1d2330", ky = T + 14 + 16 * i;
        append(svg, [sv("path", { d: path, fill: "none", stroke: colour, "stroke-width": 1.6, "stroke-dasharray": r.dash, cls: "roof" }),
          sv("line", { x1: L + 10, x2: L + 34, y1: ky - 4, y2: ky - 4, stroke: colour, "stroke-width": 1.6, "stroke-dasharray": r.dash }),
          sv("text", { x: L + 40, y: ky, text: r.label + " roof " + human(r.peak, "FLOP/s") + ", ridge at " + (r.peak / bw).toFixed(0) + " FLOP/B" })]);
      });
      append(svg, sv("text", { x: L + 40, y: T + 14 + 16 * roofs.length, text: "slope: memory bandwidth " + human(bw, "B/s") }));
      function tipOn(node, text) {
        node.addEventListener("mousemove", function (ev) { showTip(ev, text()); });
        node.addEventListener("mouseleave", hideTip);
        svg.appendChild(node);
      }
      var measuredAt = {};
      measured.forEach(function (p) { measuredAt[p.op] = p; });
      bounds.concat(predicted).forEach(function (p) {  // joined to the measured point of the same operator
        var m = measuredAt[p.op];
        if (m) svg.appendChild(sv("line", { x1: X(m.x), x2: X(p.x), y1: Y(m.y), y2: Y(p.y), stroke: "#9aa3b2", "stroke-dasharray": "2,2" }));
      });
      var total = est ? est.total.time_s || 1 : 1;
      pts.sort(function (a, b) { return b.r.time_s - a.r.time_s; });
      pts.forEach(function (p, i) {
        var rad = 3 + 22 * Math.sqrt(p.r.time_s / total);
        tipOn(sv("circle", { cx: X(p.x), cy: Y(p.y), r: rad.toFixed(1), cls: "point", "data-op": p.op, "data-y": String(p.y),
          fill: p.r.bound === "compute" ? "var(--compute)" : "var(--memory)", "fill-opacity": 0.55, stroke: "#333", "stroke-width": 0.6 }), function () {
          return p.op + "\n" + p.r.calls + " calls, " + human(p.r.flops, "FLOP") + ", " + bytes(p.r.bytes) +
            "\nintensity " + p.x.toFixed(2) + " FLOP/B, " + human(p.y, "FLOP/s") +
            "\nestimated " + secs(p.r.time_s) + " (" + pct(p.r.share, 1) + " of the estimate), " + p.r.bound + "-bound";
        });
        if (i < 8) svg.appendChild(sv("text", { x: X(p.x) + rad + 2, y: Y(p.y) + 4, text: shortOp(p.op) }));
      });
      measured.sort(function (a, b) { return b.r.seconds - a.r.seconds; });
      measured.forEach(function (p, i) {
        var rad = est ? 4 : 3 + 22 * Math.sqrt(p.r.seconds / (measuredTotal || 1));
        tipOn(sv("circle", { cx: X(p.x), cy: Y(p.y), r: rad.toFixed(1), cls: "measured-point", "data-op": p.op, "data-y": String(p.y),
          fill: est ? "none" : "#c0392b", "fill-opacity": est ? null : 0.45, stroke: "#c0392b", "stroke-width": 1.4 }), function () {
          return p.op + " (measured)\n" + p.r.calls + " calls, " + secs(p.r.seconds) + ", " + human(p.y, "FLOP/s") +
            "\nintensity " + p.x.toFixed(2) + " FLOP/B" +
            (p.r.bound_s ? "\nbound " + secs(p.r.bound_s) : "") + (p.r.predicted_s ? ", predicted " + secs(p.r.predicted_s) : "") +
            (p.r.efficiency !== null && p.r.efficiency !== undefined ? "\n" + (100 * p.r.efficiency).toFixed(0) + "% of its roof" : "");
        });
        if (!est && i < 8) svg.appendChild(sv("text", { x: X(p.x) + rad + 2, y: Y(p.y) + 4, text: shortOp(p.op) }));
      });
      bounds.forEach(function (p) {
        var x = X(p.x), y = Y(p.y);
        tipOn(sv("path", { d: "M" + (x - 4) + "," + (y - 4) + " L" + (x + 4) + "," + (y + 4) + " M" + (x - 4) + "," + (y + 4) + " L" + (x + 4) + "," + (y - 4),
          stroke: "#4a5568", "stroke-width": 1.6, cls: "bound-point", "data-op": p.op, "data-y": String(p.y) }), function () {
          return p.op + " (roofline bound)\n" + secs(p.s) + ", " + human(p.y, "FLOP/s");
        });
      });
      predicted.forEach(function (p) {
        tipOn(sv("rect", { x: X(p.x) - 3.5, y: Y(p.y) - 3.5, width: 7, height: 7, fill: "#8e44ad", "fill-opacity": 0.7,
          cls: "predicted-point", "data-op": p.op, "data-y": String(p.y) }), function () {
          return p.op + " (predicted)\n" + secs(p.s) + ", " + human(p.y, "FLOP/s");
        });
      });
    }
    draw();
  }

  // -- memory -------------------------------------------------------------------------------------
  var CATEGORY_COLOURS = { parameters: "#3b7dd8", buffers: "#e8743b", inputs: "#5aa469", gradients: "#b36bc2",
    optimizer_state: "#d4a017", activations: "#4bb3b3", temporaries: "#8e9aaf", workspace: "#c0392b", other: "#6b4f3a" };
  function categoryColour(k) { return CATEGORY_COLOURS[k] || "#999"; }
  function memory(host, mem) {
    var facts = el("dl", { cls: "facts" });
    function fact(k, v) { append(facts, [el("dt", { text: k }), el("dd", {}, v)]); }
    fact("peak", el("b", { id: "memory-peak", "data-value": String(mem.peak_bytes), text: bytes(mem.peak_bytes) }));
    fact("reached", (mem.peak_phase || "") + " in " + (mem.peak_module ? "'" + mem.peak_module + "'" : "the root") +
      (mem.peak_op ? " at " + mem.peak_op : ""));
    if (mem.end_bytes !== undefined) fact("live at the end", bytes(mem.end_bytes));
    if (mem.note) fact("what ran", mem.note);
    if (mem.excludes) fact("not counted", mem.excludes);
    append(host, facts);
    var at = mem.at_peak || {}, keys = Object.keys(at), sum = 0;
    keys.forEach(function (k) { sum += at[k]; });
    if (sum) {
      append(host, el("h3", { text: "live at the peak" }));
      var bar = el("div", { cls: "bar" }), legend = el("div", { cls: "legend" });
      keys.forEach(function (k) {
        var c = categoryColour(k);
        append(bar, el("span", { style: "width:" + (100 * at[k] / sum) + "%;background:" + c, title: k + ": " + bytes(at[k]) }));
        append(legend, el("span", {}, [el("i", { style: "background:" + c }), k.replace(/_/g, " ") + " " + bytes(at[k]) + " (" + pct(at[k], sum) + ")"]));
      });
      append(host, [bar, legend]);
    }
    if (mem.timeline && mem.timeline.index && mem.timeline.index.length) return timeline(host, mem.timeline, mem);
    return null;
  }
  function timeline(host, tl, mem) {  // {calls, index: [call], phase: [..], categories: {cat: [bytes]}}
    var cats = Object.keys(tl.categories), n = tl.index.length;
    var svg = sv("svg", { cls: "chart", id: "memory-timeline", width: 760, height: 280, viewBox: "0 0 760 280" });
    var L = 80, R = 740, T = 14, B = 230, top = mem.peak_bytes || 1, last = Math.max(tl.calls - 1, 1);
    function X(call) { return L + (R - L) * call / last; }
    function Y(v) { return B - (B - T) * v / top; }
    var base = tl.index.map(function () { return 0; });
    cats.forEach(function (k) {
      var vals = tl.categories[k], upper = vals.map(function (v, i) { return base[i] + v; });
      var d = upper.map(function (v, i) { return (i ? "L" : "M") + X(tl.index[i]).toFixed(1) + "," + Y(v).toFixed(1); }).join(" ");
      for (var i = n - 1; i >= 0; i--) d += " L" + X(tl.index[i]).toFixed(1) + "," + Y(base[i]).toFixed(1);
      append(svg, sv("path", { d: d + " Z", fill: categoryColour(k), "fill-opacity": 0.75, cls: "area", "data-category": k },
        sv("title", { text: k.replace(/_/g, " ") })));
      base = upper;
    });
    var peakAt = 0;
    base.forEach(function (v, i) { if (v > base[peakAt]) peakAt = i; });
    var px = X(tl.index[peakAt]);
    append(svg, [sv("line", { x1: px, x2: px, y1: T, y2: B, stroke: "#c0392b", "stroke-dasharray": "3,3" }),
      sv("text", { x: Math.min(px + 4, R - 150), y: T + 10, id: "timeline-peak", "data-value": String(base[peakAt]), text: "peak " + bytes(base[peakAt]) + " at call " + tl.index[peakAt] }),
      sv("line", { cls: "axis", x1: L, x2: R, y1: B, y2: B }), sv("line", { cls: "axis", x1: L, x2: L, y1: T, y2: B }),
      sv("text", { x: L - 6, y: T + 4, "text-anchor": "end", text: bytes(top) }), sv("text", { x: L - 6, y: B, "text-anchor": "end", text: "0" }),
      sv("text", { x: L, y: B + 16, "text-anchor": "middle", text: "0" }), sv("text", { x: R, y: B + 16, "text-anchor": "middle", text: String(tl.calls - 1) }),
      sv("text", { x: (L + R) / 2, y: B + 34, "text-anchor": "middle", text: "operator call" })]);
    var prev = null;  // phase boundaries
    tl.phase.forEach(function (p, i) {
      if (p !== prev && i) {
        var x = X(tl.index[i]);
        append(svg, [sv("line", { x1: x, x2: x, y1: T, y2: B, stroke: "#888", "stroke-width": 0.8 }), sv("text", { x: x + 3, y: B - 6, text: p })]);
      }
      prev = p;
    });
    var hover = sv("rect", { x: L, y: T, width: R - L, height: B - T, fill: "transparent" });
    hover.addEventListener("mousemove", function (ev) {
      var box = svg.getBoundingClientRect(), call = (ev.clientX - box.left) * 760 / box.width;
      var k = 0, want = (call - L) / (R - L) * last;
      tl.index.forEach(function (c, i) { if (Math.abs(c - want) < Math.abs(tl.index[k] - want)) k = i; });
      showTip(ev, "call " + tl.index[k] + " (" + tl.phase[k] + "): " + bytes(base[k]) + " live\n" +
        cats.map(function (c) { return c.replace(/_/g, " ") + " " + bytes(tl.categories[c][k]); }).join("\n"));
    });
    hover.addEventListener("mouseleave", hideTip);
    svg.appendChild(hover);
    var shade = sv("g", { id: "timeline-phase" });  // the spans of the phase chosen above the icicle
    svg.insertBefore(shade, svg.firstChild);
    append(host, [el("h3", { text: "live memory over the run's " + tl.calls + " operator calls" }),
      el("p", { cls: "hint", text: tl.calls > n ? "The highest of every " + Math.ceil(tl.calls / n) + " calls is drawn, so the peak is exact." : "Every call." }), svg]);
    return { phase: function (phase) {
      while (shade.firstChild) shade.removeChild(shade.firstChild);
      shade.setAttribute("data-phase", phase || "");
      if (!phase) return;
      var start = null;
      tl.phase.forEach(function (p, i) {
        if (p === phase && start === null) start = i;
        if ((p !== phase || i === n - 1) && start !== null) {
          var end = p === phase ? i : i - 1;
          append(shade, sv("rect", { x: X(tl.index[start]), y: T, width: Math.max(X(tl.index[end]) - X(tl.index[start]), 1), height: B - T,
            fill: "#fff3c4", cls: "phase-span", "data-from": String(tl.index[start]), "data-to": String(tl.index[end]) }));
          start = null;
        }
      });
    } };
  }

  // -- the report page ------------------------------------------------------------------------------
  function card(label, value, key, raw, note) {
    return el("div", { cls: "card" }, [el("div", { cls: "label", text: label }),
      el("div", { cls: "value total", "data-key": key, "data-value": raw === undefined ? null : String(raw), text: value }),
      note ? el("div", { cls: "exact", text: note }) : null]);
  }
  function subjectOf(rep) {
    var src = rep.meta && rep.meta.source, name = rep.model || "counted code";
    return src && src !== name ? name + " (" + src + ")" : name;
  }
  var PHASES = ["forward", "backward", "recompute", "optimizer"];
  function headlineCards(rep) {
    var t = rep.totals, cards = [
      card("parameters", human(t.params), "params", exactOf(t, "params"), exact(exactOf(t, "params"))),
      card("MACs", human(t.macs, "MAC"), "macs", exactOf(t, "macs"), exact(exactOf(t, "macs"))),
      card("FLOPs", human(t.flops, "FLOP"), "flops", exactOf(t, "flops"), exact(exactOf(t, "flops"))),
      card("bytes read + written", bytes(t.bytes_read + t.bytes_written), "bytes", plus(exactOf(t, "bytes_read"), exactOf(t, "bytes_written")),
           bytes(t.bytes_read) + " read, " + bytes(t.bytes_written) + " written")];
    if (rep.estimate) cards.push(card("estimated time (lower bound)", secs(rep.estimate.total.time_s), "estimate", rep.estimate.total.time_s,
      rep.estimate.total.bound + "-bound on " + rep.estimate.hardware.name));
    if (rep.measured) cards.push(card("measured time", secs(rep.measured.wall_s), "measured", rep.measured.wall_s,
      "median of " + rep.measured.repeat + " on " + rep.measured.device));
    if (rep.memory) cards.push(card("peak memory", bytes(rep.memory.peak_bytes), "memory", rep.memory.peak_bytes, rep.memory.note || ""));
    return el("div", { cls: "cards" }, cards);
  }
  function phaseLine(rep) {
    var ph = PHASES.filter(function (p) { return rep.totals[p]; });
    if (ph.length < 2) return null;
    return el("p", { cls: "sub", text: ph.map(function (p) {
      return p + ": " + human(rep.totals[p].macs, "MAC") + ", " + human(rep.totals[p].flops, "FLOP");
    }).join(" \u00b7 ") });
  }
  function warnings(rep) {
    var out = [], unc = rep.uncounted || {}, ops = Object.keys(unc);
    if (ops.length) out.push(el("div", { cls: "warn", id: "warn-uncounted" }, [
      el("b", { text: ops.length + " operator(s) had no rule and count as 0 FLOPs" }),
      el("ul", {}, ops.map(function (op) { return el("li", {}, [el("code", { text: op }), " (" + unc[op] + " call" + (unc[op] === 1 ? "" : "s") + ")"]); })),
      el("span", { cls: "hint", text: "add a rule (--rules file.py), or fail on them with --strict" })]));
    if ((rep.opaque || []).length) out.push(el("div", { cls: "warn", id: "warn-opaque" }, [
      el("b", { text: rep.opaque.length + " module(s) produced outputs without arithmetic (possibly opaque)" }),
      el("ul", {}, rep.opaque.map(function (p) { return el("li", {}, el("code", { text: p })); })),
      el("span", { cls: "hint", text: "their work may bypass the dispatcher: give them a module rule" })]));
    var bad = (rep.rules || []).filter(function (r) {
      return r.macs_only ? r.cost.macs !== r.shadowed.macs : (r.cost.macs !== r.shadowed.macs || r.cost.flops !== r.shadowed.flops);
    });
    if (bad.length) out.push(el("div", { cls: "warn", id: "warn-rules" }, [
      el("b", { text: bad.length + " module rule(s) disagree with the operators they replaced" }),
      el("ul", {}, bad.map(function (r) {
        return el("li", { text: "'" + r.module + "' (" + r.rule + "): rule " + human(r.cost.macs, "MAC") + " / " + human(r.cost.flops, "FLOP") +
          ", operators " + human(r.shadowed.macs, "MAC") + " / " + human(r.shadowed.flops, "FLOP") });
      }))]));
    if (!out.length) out.push(el("p", { cls: "ok", id: "warn-none", text: "Every operator that ran had a rule; no module looked opaque." }));
    return out;
  }
  function provenance(rep, about) {
    var dl = el("dl", { cls: "facts", id: "provenance" }), m = rep.meta || {};
    function fact(k, v) { if (v !== undefined && v !== null && v !== "") append(dl, [el("dt", { text: k }), el("dd", { text: String(v) })]); }
    fact("model", rep.model || "counted code");
    fact("source", m.source);
    fact("inputs", (m.inputs || []).join(", "));
    if (m.model_type) fact("model type", m.model_type);
    if (m.config && Object.keys(m.config).length) fact("config", JSON.stringify(m.config));
    fact("run", rep.shape_only ? "shape-only (fake tensors: no arithmetic ran)" : "real tensors");
    fact("phases", PHASES.filter(function (p) { return rep.totals[p]; }).join(" + "));
    if (m.reference_gmacs) fact("published figure", m.reference_gmacs + " GMAC (counted: " + (rep.totals.macs / 1e9).toFixed(3) + " GMAC)");
    if (rep.world_size) fact("rank", rep.rank + " of " + rep.world_size);
    var v = (about && about.versions) || {};
    fact("versions", Object.keys(v).map(function (k) { return k + " " + v[k]; }).join(", "));
    fact("page made", about && about.created);
    fact("schema", rep.schema);
    return dl;
  }
  function moduleRows(rep, tree) {
    var est = rep.estimate && rep.estimate.by_module, mes = rep.measured && rep.measured.by_module,
        mem = rep.memory && rep.memory.by_module;
    return tree.order.map(function (n) {
      var r = { path: n.path || "(root)", indent: n.depth, type: n.type, depth: n.depth, params: n.params, calls: n.calls,
                macs: n.incl.macs, flops: n.incl.flops, bytes: n.incl.bytes, self_flops: n.self.flops,
                _exact: { macs: n.exact.macs, flops: n.exact.flops, bytes: n.exact.bytes, self_flops: n.own.flops } };
      if (est) { var e = est[n.path]; r.est = e ? e.time_s : null; r.bound = e ? e.bound : null; r.intensity = e ? e.intensity : null; }
      if (mes) { var s = mes[n.path]; r.measured = s ? s.seconds : null; }
      if (mem) r.peak = mem[n.path] === undefined ? null : mem[n.path];
      return r;
    });
  }
  function opRows(rep) {
    var acc = new Map();
    (rep.records || []).forEach(function (r) {
      var a = acc.get(r.op);
      if (!a) { a = { op: r.op, calls: 0, macs: 0, flops: 0, bytes: 0, counted: r.counted ? "yes" : "no rule", _exact: { macs: 0, flops: 0, bytes: 0 } }; acc.set(r.op, a); }
      a.calls += r.calls; a.macs += r.macs; a.flops += r.flops; a.bytes += r.bytes_read + r.bytes_written;
      var x = a._exact;
      x.macs = plus(x.macs, exactOf(r, "macs")); x.flops = plus(x.flops, exactOf(r, "flops"));
      x.bytes = plus(x.bytes, plus(exactOf(r, "bytes_read"), exactOf(r, "bytes_written")));
    });
    var est = rep.estimate && rep.estimate.by_op, mes = rep.measured && rep.measured.by_op;
    return Array.from(acc.values()).map(function (a) {
      if (est) { var e = est[a.op]; a.est = e ? e.time_s : null; a.bound = e ? e.bound : null; a.intensity = e ? e.intensity : null; a.share = e ? e.share : null; }
      if (mes) { var s = mes[a.op]; a.measured = s ? s.seconds : null; a.rate = s ? s.flops_per_s : null; a.efficiency = s ? s.efficiency : null; }
      return a;
    });
  }
  function boundCls(v) { return v === "compute" ? "bound-compute" : v === "memory" ? "bound-memory" : ""; }
  function fixed(d) { return function (v) { return v === null || v === undefined ? "-" : v.toFixed(d); }; }
  function share(v) { return v === null || v === undefined ? "-" : (100 * v).toFixed(1) + "%"; }
  function countColumns() {
    return [{ key: "macs", label: "MACs", num: true, fmt: function (v) { return human(v); } },
            { key: "flops", label: "FLOPs", num: true, fmt: function (v) { return human(v); } },
            { key: "bytes", label: "bytes", num: true, fmt: bytes }];
  }
  function sectionColumns(rep, ops) {
    var c = [];
    if (rep.estimate) c.push({ key: "est", label: "est. time", num: true, fmt: secs, title: "roofline lower bound" },
      { key: "intensity", label: "FLOP/B", num: true, fmt: fixed(1) },
      { key: "bound", label: "bound", num: false, cls: boundCls });
    if (rep.estimate && ops) c.push({ key: "share", label: "share", num: true, fmt: share });
    if (rep.measured) {
      c.push({ key: "measured", label: "measured", num: true, fmt: secs });
      if (ops) c.push({ key: "rate", label: "FLOP/s", num: true, fmt: function (v) { return human(v); } },
        { key: "efficiency", label: "efficiency", num: true, fmt: share });
    }
    if (rep.memory && !ops) c.push({ key: "peak", label: "peak memory", num: true, fmt: bytes, title: "the most live while the module ran" });
    return c;
  }
  function moduleTable(host, rep, tree, id) {
    var depth = el("select", { id: id + "-depth", "aria-label": "depth" },
      ["1", "2", "3", "4", "all"].map(function (d) { return el("option", { value: d, text: d === "all" ? "every level" : "depth \u2264 " + d, selected: d === "2" ? "selected" : null }); }));
    var cols = [{ key: "path", label: "module", num: false, fmt: function (v, r) { return "\u00a0\u00a0".repeat(Math.min(r.indent, 12)) + v; } },
      { key: "type", label: "type", num: false }, { key: "params", label: "params", num: true, fmt: function (v) { return human(v); } }]
      .concat(countColumns(), [{ key: "self_flops", label: "self FLOPs", num: true, fmt: function (v) { return human(v); } },
        { key: "calls", label: "calls", num: true }], sectionColumns(rep, false));
    var t = table(host, id, cols, moduleRows(rep, tree), {
      controls: [depth],
      keep: function (r) { return depth.value === "all" || r.depth <= Number(depth.value); } });
    depth.addEventListener("change", t.redraw);
  }
  function opTable(host, rep, id) {
    var cols = [{ key: "op", label: "operator", num: false }, { key: "calls", label: "calls", num: true }]
      .concat(countColumns(), [{ key: "counted", label: "rule", num: false }], sectionColumns(rep, true));
    table(host, id, cols, opRows(rep), { sort: rep.estimate ? "est" : "flops" });
  }
  var KNOWN = ["schema", "model", "shape_only", "meta", "totals", "modules", "records", "rules", "opaque", "uncounted",
               "rank", "world_size", "estimate", "memory", "measured"];
  function otherSections(host, rep) {
    var keys = Object.keys(rep).filter(function (k) { return KNOWN.indexOf(k) < 0; });
    if (!keys.length) return;
    append(host, el("h2", { text: "Other sections" }));
    keys.forEach(function (k) {
      append(host, el("details", { id: "section-" + k }, [el("summary", { text: k }), el("pre", { cls: "json", text: JSON.stringify(rep[k], null, 2) })]));
    });
  }
  // the report seen through one phase: its records, the estimate's rows of that phase (the
  // estimate's "phases"), no measured time (measured per operator over every phase)
  function phasesOf(rep) {
    var seen = {};
    (rep.records || []).forEach(function (r) { seen[r.phase] = true; });
    return PHASES.filter(function (p) { return seen[p]; }).concat(Object.keys(seen).filter(function (p) { return PHASES.indexOf(p) < 0; }));
  }
  function phaseView(rep, phase) {
    if (!phase) return rep;
    var v = Object.assign({}, rep);
    v.records = (rep.records || []).filter(function (r) { return r.phase === phase; });
    var est = rep.estimate, p = est && est.phases && est.phases[phase];
    v.estimate = p ? Object.assign({}, est, { by_op: p.by_op, by_module: p.by_module, total: est.by_phase[phase] }) : null;
    v.measured = null;
    return v;
  }
  function drawReport(root, rep, about) {
    var tree = buildTree(rep), phases = phasesOf(rep);
    append(root, [el("h1", { id: "subject", text: subjectOf(rep) }),
      el("p", { cls: "sub", text: [(rep.meta && rep.meta.inputs || []).join(", ") ? "input " + rep.meta.inputs.join(", ") : "",
        rep.shape_only ? "shape-only" : "", rep.records.length + " operator records, " + tree.order.length + " modules"].filter(Boolean).join(" \u00b7 ") }),
      headlineCards(rep), phaseLine(rep)]);
    append(root, [el("h2", { text: "Warnings" })].concat(warnings(rep)));
    var pick = null, note = el("span", { cls: "hint", id: "phase-note" });
    if (phases.length > 1) {
      pick = el("select", { id: "phase", "aria-label": "phase" }, [el("option", { value: "", text: "every phase" })].concat(
        phases.map(function (p) { return el("option", { value: p, text: p }); })));
      append(root, el("div", { cls: "controls phase-bar" }, [el("label", { text: "show the phase" }), pick, note]));
    }
    var ice = el("section", { id: "tree" }), rl = el("section", { id: "roofline-section" }), mt = el("section"), ot = el("section");
    append(root, [el("h2", { text: "Where the cost sits" }), el("p", { cls: "hint",
      text: "The module tree as an icicle: each block is a module, as wide as its share of the chosen measure (itself and everything inside it). Click a block to zoom in, click it again (or a name above) to zoom out; hover for its own and inclusive values." }), ice]);
    var hasRoofline = rep.estimate || (rep.measured && rep.measured.peaks);
    if (hasRoofline) append(root, [el("h2", { text: "Roofline" }), rl]);
    if (rep.memory) {
      var mh = el("section", { id: "memory" });
      append(root, [el("h2", { text: "Memory" }), mh]);
      var memoryTimeline = memory(mh, rep.memory);
    }
    append(root, [el("h2", { text: "Modules" }), el("p", { cls: "hint", text: "Inclusive values (the module and everything inside it); click a header to sort." }), mt]);
    append(root, [el("h2", { text: "Operators" }), ot]);
    function drawPhase(phase) {  // the icicle, the roofline and both tables, of one phase or all
      var view = phaseView(rep, phase), vtree = phase ? buildTree(view) : tree;
      [ice, rl, mt, ot].forEach(function (h) { h.textContent = ""; });
      root.setAttribute("data-phase", phase);
      note.textContent = !phase ? "" : (rep.measured ? "measured time is per operator over every phase: not shown for one phase. " : "") +
        (rep.estimate && !view.estimate ? "this report's estimate has no rows per phase. " : "");
      icicle(ice, view, vtree, { id: "icicle" });
      if (memoryTimeline) memoryTimeline.phase(phase);
      if (view.estimate || (view.measured && view.measured.peaks)) roofline(rl, view);
      else if (hasRoofline) append(rl, el("p", { cls: "hint", text: "no roofline for this phase" }));
      moduleTable(mt, view, vtree, "modules");
      opTable(ot, view, "operators");
    }
    if (pick) pick.addEventListener("change", function () { drawPhase(pick.value); });
    drawPhase("");
    otherSections(root, rep);
    append(root, [el("h2", { text: "Where these numbers come from" }), provenance(rep, about)]);
  }
