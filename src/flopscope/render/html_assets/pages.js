/* flopscope page, part 5 of 5: the other pages (diff, table, symbolic, generation), and the start. */
  // -- two reports compared -----------------------------------------------------------------------
  function drawDiff(root, data, about) {
    var a = data.a, b = data.b, names = data.names || ["a", "b"];
    var ta = buildTree(a), tb = buildTree(b);
    append(root, [el("h1", { id: "subject", text: "flopscope diff: " + names[0] + " \u2192 " + names[1] })]);
    var side = el("div", { cls: "side" });
    [[a, names[0]], [b, names[1]]].forEach(function (p) {
      append(side, el("div", {}, [el("h3", { text: p[1] + ": " + subjectOf(p[0]) }), headlineCards(p[0])]));
    });
    append(root, side);
    var da = a.totals.flops, db = b.totals.flops;
    append(root, el("p", { cls: "sub", id: "diff-total", text: "FLOPs " + human(da) + " \u2192 " + human(db) + " (" + (db - da >= 0 ? "+" : "") + human(db - da) +
      (da ? ", " + (db - da >= 0 ? "+" : "") + (100 * (db - da) / da).toFixed(2) + "%" : "") + ")" }));
    var rows = [], paths = [];
    ta.order.forEach(function (n) { paths.push(n.path); });
    tb.order.forEach(function (n) { if (!ta.nodes.has(n.path)) paths.push(n.path); });
    paths.forEach(function (p) {
      var x = ta.nodes.get(p), y = tb.nodes.get(p);
      var fa = x ? x.incl.flops : null, fb = y ? y.incl.flops : null;
      var ma = x ? x.incl.macs : null, mb = y ? y.incl.macs : null;
      var pa = x ? x.params : null, pb = y ? y.params : null;
      var cls = !x ? "added" : !y ? "removed" : (fa !== fb || ma !== mb || pa !== pb) ? "changed" : "";
      rows.push({ path: p || "(root)", type: (y || x).type, depth: (y || x).depth, flops_a: fa, flops_b: fb,
        delta: (fb || 0) - (fa || 0), rel: fa ? ((fb || 0) - fa) / fa : null, macs_a: ma, macs_b: mb, params_a: pa, params_b: pb,
        what: cls || "same", _cls: cls });
    });
    var only = el("select", { id: "diff-only", "aria-label": "rows" }, [el("option", { value: "changed", text: "changed modules" }), el("option", { value: "all", text: "every module" })]);
    function h(v) { return v === null ? "-" : human(v); }
    function signed(v) { return v === null ? "-" : (v > 0 ? "+" : "") + human(v); }
    function upDown(v) { return v > 0 ? "up" : v < 0 ? "down" : ""; }
    var host = el("section");
    append(root, [el("h2", { text: "Modules" }), el("p", { cls: "hint", text: "Inclusive FLOPs, MACs and parameters of each module in both reports; rows in colour differ (yellow: changed, green: only in " + names[1] + ", red: only in " + names[0] + ")." }), host]);
    var t = table(host, "diff", [{ key: "path", label: "module", num: false }, { key: "type", label: "type", num: false },
      { key: "flops_a", label: "FLOPs " + names[0], num: true, fmt: h }, { key: "flops_b", label: "FLOPs " + names[1], num: true, fmt: h },
      { key: "delta", label: "\u0394 FLOPs", num: true, fmt: signed, cls: upDown },
      { key: "rel", label: "\u0394 %", num: true, fmt: function (v) { return v === null ? "-" : (v > 0 ? "+" : "") + (100 * v).toFixed(2) + "%"; }, cls: upDown },
      { key: "macs_a", label: "MACs " + names[0], num: true, fmt: h }, { key: "macs_b", label: "MACs " + names[1], num: true, fmt: h },
      { key: "params_a", label: "params " + names[0], num: true, fmt: h }, { key: "params_b", label: "params " + names[1], num: true, fmt: h },
      { key: "what", label: "", num: false }], rows,
      { controls: [only], keep: function (r) { return only.value === "all" || r._cls; } });
    only.addEventListener("change", t.redraw);
    var two = el("div", { cls: "side" }), ia = el("div"), ib = el("div");
    append(two, [el("div", {}, [el("h3", { text: names[0] }), ia]), el("div", {}, [el("h3", { text: names[1] }), ib])]);
    append(root, [el("h2", { text: "Where the cost sits" }), two]);
    // each side coloured by what happened to the module: the same, changed, only on this side
    var what = new Map(rows.map(function (r) { return [r.path === "(root)" ? "" : r.path, r._cls]; }));
    function colourBy(only) {
      return function (n) { var w = what.get(n.path); return w === "changed" ? "#f0b429" : w === only ? (only === "added" ? "#5aa469" : "#d9534f") : "#b9c6d8"; };
    }
    icicle(ia, a, ta, { id: "icicle-a", colour: colourBy("removed"), legend: [["#b9c6d8", "the same"], ["#f0b429", "changed"], ["#d9534f", "only in " + names[0]]] });
    icicle(ib, b, tb, { id: "icicle-b", colour: colourBy("added"), legend: [["#b9c6d8", "the same"], ["#f0b429", "changed"], ["#5aa469", "only in " + names[1]]] });
    append(root, [el("h2", { text: "Where these numbers come from" }), el("div", { cls: "side" }, [provenance(a, about), provenance(b, about)])]);
  }

  // -- a plain table (the zoo) -----------------------------------------------------------------------
  function drawTable(root, data, about) {
    append(root, [el("h1", { id: "subject", text: data.title || "flopscope" }), data.note ? el("p", { cls: "sub", text: data.note }) : null]);
    var cols = data.columns.map(function (c) {
      var num = data.rows.some(function (r) { return typeof r[c] === "number"; });
      return { key: c, label: c, num: num, fmt: num ? function (v) { return typeof v === "number" ? (Number.isInteger(v) ? human(v) : v.toPrecision(4)) : (v === null || v === undefined ? "-" : String(v)); } : null };
    });
    var host = el("section");
    append(root, host);
    table(host, "table", cols, data.rows, {});
    var v = (about && about.versions) || {};
    append(root, el("p", { cls: "hint", text: "made " + (about && about.created) + " with " + Object.keys(v).map(function (k) { return k + " " + v[k]; }).join(", ") }));
  }

  // -- a symbolic report -------------------------------------------------------------------------------
  function drawSymbolic(root, data, about) {
    var sym = data.symbolic, derived = data.derived || {};
    append(root, [el("h1", { id: "subject", text: "flopscope symbolic: " + (data.model || "model") }),
      el("p", { cls: "sub", text: "symbols: " + Object.keys(data.symbols || {}).map(function (k) { return k + (data.hints && data.hints[k] !== undefined ? " (traced at " + data.hints[k] + ")" : ""); }).join(", ") +
        ((data.domain || []).length ? " \u00b7 valid for " + data.domain.join(", ") : " \u00b7 valid for all sizes") })]);
    var dl = el("dl", { cls: "facts", id: "formulas-total" });
    ["macs", "flops", "bytes_read", "bytes_written"].forEach(function (k) {
      if (sym.total[k] !== undefined) append(dl, [el("dt", { text: k }), el("dd", {}, el("code", { text: sym.total[k] }))]);
    });
    append(root, [el("h2", { text: "Total" }), dl]);
    if (derived.per_token || derived.crossover) {
      var dd = el("dl", { cls: "facts", id: "derived" }), pt = derived.per_token, cr = derived.crossover;
      if (pt) append(dd, [el("dt", { text: "FLOPs per token" }), el("dd", {}, [el("code", { id: "per-token", "data-formula": pt.formula, text: pt.formula }),
        " (d FLOPs / d " + pt.symbol + ", per sample; " + human(pt.at_hints, "FLOP") + " at the traced sizes)"])]);
      if (cr) append(dd, [el("dt", { text: "attention overtakes the rest" }), el("dd", { id: "crossover", "data-value": cr.at === null ? "" : String(cr.at),
        text: cr.at === null ? "never: no term grows faster than " + cr.symbol : "at " + cr.symbol + " = " + exact(cr.at) + " (terms in " + cr.symbol +
          "\u00b2 and above against the rest, " + Object.keys(cr.fixed).map(function (k) { return k + " = " + cr.fixed[k]; }).join(", ") + ")" })]);
      append(root, [el("h2", { text: "Per token" }), dd]);
    }
    var bySymbol = {};
    (data.curves || []).forEach(function (c) { (bySymbol[c.symbol] = bySymbol[c.symbol] || []).push(c); });
    Object.keys(bySymbol).forEach(function (s) { curveChart(root, s, bySymbol[s], data); });
    var rows = Object.keys(sym.modules).map(function (p) { var m = sym.modules[p]; return { path: p || "(root)", macs: m.macs, flops: m.flops, bytes_read: m.bytes_read, bytes_written: m.bytes_written }; });
    var host = el("section");
    var formula = { num: false, fmt: function (v) { return v === undefined ? "-" : v; } };
    function cols(first, label) {
      return [{ key: first, label: label, num: false }].concat(["macs", "flops", "bytes_read", "bytes_written"].map(function (k) {
        return Object.assign({ key: k, label: k.replace("_", " ") }, formula);
      }));
    }
    append(root, [el("h2", { text: "Per module" }), el("p", { cls: "hint", text: "Each module's formulas, inclusive (the module and everything inside it)." }), host]);
    table(host, "symbolic-modules", cols("path", "module"), rows, {});
    var ops = Object.keys(sym.ops).map(function (o) { var c = sym.ops[o]; return { op: o, macs: c.macs, flops: c.flops, bytes_read: c.bytes_read, bytes_written: c.bytes_written }; });
    var oh = el("section");
    append(root, [el("h2", { text: "Per operator" }), oh]);
    table(oh, "symbolic-ops", cols("op", "operator"), ops, {});
    var v = (about && about.versions) || {};
    append(root, el("p", { cls: "hint", text: "made " + (about && about.created) + " with " + Object.keys(v).map(function (k) { return k + " " + v[k]; }).join(", ") }));
  }
  // one chart per symbol: the chosen field of the chosen module over the domain; for seq_len the
  // total split into attention's terms and the rest, the crossover marked
  function curveChart(root, symbol, curves, data) {
    var fields = [], modules = [];
    curves.forEach(function (c) {
      if (fields.indexOf(c.field) < 0) fields.push(c.field);
      if (modules.indexOf(c.module || "") < 0) modules.push(c.module || "");
    });
    var fsel = el("select", { id: "curve-field-" + symbol, "aria-label": "field" }, fields.map(function (f) { return el("option", { value: f, text: f }); }));
    var msel = el("select", { id: "curve-module-" + symbol, "aria-label": "module" }, modules.map(function (m) { return el("option", { value: m, text: m || "the whole model" }); }));
    var title = el("h3"), hint = el("p", { cls: "hint" });
    var svg = sv("svg", { cls: "chart", width: 760, height: 300, viewBox: "0 0 760 300", "data-symbol": symbol });
    append(root, [title, el("div", { cls: "controls" }, [el("label", { text: "plot" }), fsel, el("label", { text: "of" }), msel]), svg, hint]);
    fsel.addEventListener("change", draw);
    msel.addEventListener("change", draw);
    function draw() {
      var c = curves.filter(function (x) { return x.field === fsel.value && (x.module || "") === msel.value; })[0];
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      var others = c ? Object.keys(c.fixed || {}).map(function (k) { return k + " = " + c.fixed[k]; }).join(", ") : "";
      title.textContent = fsel.value + " of " + (msel.value || "the whole model") + " against " + symbol + (others ? " (" + others + ")" : "");
      svg.setAttribute("data-field", fsel.value);
      svg.setAttribute("data-module", msel.value);
      if (!c) { append(svg, sv("text", { x: 90, y: 40, text: "no curve: a data-dependent size" })); return; }
      var L = 80, R = 740, T = 12, B = 260, P = c.points;
      var xs = P.map(function (p) { return p[0]; }), ys = P.map(function (p) { return p[1]; });
      var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs), y1 = Math.max.apply(null, ys.concat([1]));
      function X(v) { return L + (R - L) * (v - x0) / ((x1 - x0) || 1); }
      function Y(v) { return B - (B - T) * v / y1; }
      function line(pts) { return pts.map(function (p, i) { return (i ? "L" : "M") + X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); }).join(" "); }
      if (c.split) {  // stacked: the rest below, attention's terms on top
        var rest = c.split.rest, top = c.split.high.map(function (p, i) { return [p[0], p[1] + rest[i][1]]; });
        var base = "L" + X(x1).toFixed(1) + "," + Y(0) + " L" + X(x0).toFixed(1) + "," + Y(0) + " Z";
        append(svg, [sv("path", { d: line(top) + " " + rest.slice().reverse().map(function (p) { return "L" + X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); }).join(" ") + " Z",
            fill: "var(--compute)", "fill-opacity": 0.35, cls: "split-high" }),
          sv("path", { d: line(rest) + " " + base, fill: "var(--memory)", "fill-opacity": 0.25, cls: "split-rest" })]);
        if (c.crossover !== null && c.crossover !== undefined && c.crossover >= x0 && c.crossover <= x1) {
          var cx = X(c.crossover);
          append(svg, [sv("line", { x1: cx, x2: cx, y1: T, y2: B, stroke: "#c0392b", "stroke-dasharray": "4,3", cls: "crossover", "data-value": String(c.crossover) }),
            sv("text", { x: Math.min(cx + 4, R - 170), y: T + 12, text: "attention = the rest at " + symbol + " = " + exact(c.crossover) })]);
        }
      }
      append(svg, [sv("line", { cls: "axis", x1: L, x2: R, y1: B, y2: B }), sv("line", { cls: "axis", x1: L, x2: L, y1: T, y2: B }),
        sv("path", { d: line(P), fill: "none", stroke: "var(--fg)", "stroke-width": 2 }),
        sv("text", { x: L, y: B + 16, "text-anchor": "middle", text: human(x0) }), sv("text", { x: R, y: B + 16, "text-anchor": "middle", text: human(x1) }),
        sv("text", { x: (L + R) / 2, y: B + 32, "text-anchor": "middle", text: symbol }),
        sv("text", { x: L - 6, y: T + 8, "text-anchor": "end", text: human(y1) }), sv("text", { x: L - 6, y: B, "text-anchor": "end", text: "0" })]);
      P.forEach(function (p) {
        var dot = sv("circle", { cx: X(p[0]), cy: Y(p[1]), r: 3, fill: "var(--memory)", "data-x": String(p[0]), "data-y": String(p[1]) });
        dot.addEventListener("mousemove", function (ev) { showTip(ev, symbol + " = " + exact(p[0]) + "\n" + c.field + " = " + human(p[1]) + " (" + exact(p[1]) + ")"); });
        dot.addEventListener("mouseleave", hideTip);
        svg.appendChild(dot);
      });
      hint.textContent = symbol + " from " + exact(x0) + " to " + exact(x1) + ", where the formulas hold (" +
        ((data.domain || []).length ? data.domain.join(", ") : "every size") + ")" +
        (c.split ? "; orange: the terms in " + symbol + "\u00b2 and above (attention), blue: the rest" : "") + ".";
    }
    draw();
  }

  // -- a generation: prefill and decode steps ----------------------------------------------------
  function drawGeneration(root, data, about) {
    var steps = data.steps || [];
    append(root, [el("h1", { id: "generation-subject", text: "flopscope generate: " + (data.source || (data.report && data.report.model) || "model") }),
      el("p", { cls: "sub", text: "batch " + data.batch + ", prompt " + data.prompt_len + ", " + data.new_tokens + " new tokens" +
        (data.report && data.report.shape_only ? ", shape-only" : "") })]);
    var s = data.summary || {}, cards = [];
    ["prefill", "decode"].forEach(function (k) {
      if (!s[k]) return;
      cards.push(card(k + " FLOPs per token", human(s[k].per_token.flops, "FLOP"), k + "-flops-per-token", s[k].per_token.flops, s[k].steps + " step(s), " + s[k].tokens + " token(s)"));
      cards.push(card(k + " bytes per token", bytes(s[k].per_token.bytes_read + s[k].per_token.bytes_written), k + "-bytes-per-token", null, "KV cache read " + bytes(s[k].per_token.kv_read)));
    });
    if (data.estimate) {
      cards.push(card("prefill (lower bound)", secs(data.estimate.prefill_s), "prefill-time", data.estimate.prefill_s, "on " + data.estimate.hardware));
      if (data.estimate.decode_tokens_per_s) cards.push(card("decode tokens/s (upper bound)", human(data.estimate.decode_tokens_per_s), "decode-rate", data.estimate.decode_tokens_per_s, secs(data.estimate.decode_step_s) + " per step"));
    }
    append(root, el("div", { cls: "cards" }, cards));
    (data.notes || []).forEach(function (n) { append(root, el("p", { cls: "warn", text: String(n) })); });
    // FLOPs and bytes per step, bars on a log scale (the prefill dwarfs the decode steps)
    var W = 760, H = 240, L = 70, R = 740, T = 12, B = 200, n = steps.length;
    var svg = sv("svg", { cls: "chart", id: "steps-chart", width: W, height: H, viewBox: "0 0 " + W + " " + H });
    var vals = steps.map(function (st) { return st.flops; }), top = Math.max.apply(null, vals.concat([1]));
    var bot = Math.max(Math.min.apply(null, vals.filter(function (v) { return v > 0; }).concat([top])) / 10, 1);
    function Y(v) { return B - (B - T) * (Math.log10(Math.max(v, bot)) - Math.log10(bot)) / ((Math.log10(top) - Math.log10(bot)) || 1); }
    var bw = Math.max((R - L) / Math.max(n, 1) - 2, 1);
    steps.forEach(function (st, i) {
      var x = L + i * (R - L) / Math.max(n, 1), y = Y(st.flops);
      var bar = sv("rect", { x: x.toFixed(1), y: y.toFixed(1), width: bw.toFixed(1), height: (B - y).toFixed(1), cls: "step",
        fill: st.kind === "prefill" ? "var(--compute)" : "var(--memory)" });
      bar.addEventListener("mousemove", function (ev) {
        showTip(ev, "step " + st.index + " (" + st.kind + "): " + st.tokens + " token(s), context " + st.context +
          "\n" + human(st.flops, "FLOP") + ", " + bytes(st.bytes_read + st.bytes_written) +
          (st.estimate ? "\nestimate " + secs(st.estimate.time_s) + ", " + st.estimate.bound + "-bound" : ""));
      });
      bar.addEventListener("mouseleave", hideTip);
      svg.appendChild(bar);
    });
    append(svg, [sv("line", { cls: "axis", x1: L, x2: R, y1: B, y2: B }), sv("text", { x: L - 6, y: T + 8, "text-anchor": "end", text: human(top) }),
      sv("text", { x: L - 6, y: B, "text-anchor": "end", text: human(bot) }),
      sv("text", { x: (L + R) / 2, y: B + 22, "text-anchor": "middle", text: "step (orange: prefill, blue: decode); FLOPs, log scale" })]);
    append(root, [el("h2", { text: "Steps" }), svg]);
    var host = el("section"), rows = steps.map(function (st) {
      return { index: st.index, kind: st.kind, tokens: st.tokens, context: st.context, macs: st.macs, flops: st.flops,
        bytes: st.bytes_read + st.bytes_written, kv_read: st.kv_read, kv_written: st.kv_written,
        est: st.estimate ? st.estimate.time_s : null, bound: st.estimate ? st.estimate.bound : null };
    });
    var cols = [{ key: "index", label: "step", num: true }, { key: "kind", label: "kind", num: false },
      { key: "tokens", label: "tokens", num: true }, { key: "context", label: "context", num: true }].concat(countColumns(),
      [{ key: "kv_read", label: "KV read", num: true, fmt: bytes }, { key: "kv_written", label: "KV written", num: true, fmt: bytes }]);
    if (data.estimate) cols.push({ key: "est", label: "est. time", num: true, fmt: secs }, { key: "bound", label: "bound", num: false, cls: boundCls });
    append(root, host);
    table(host, "steps", cols, rows, {});
    if (data.report) {
      append(root, el("h2", { text: "All steps together" }));
      var inner = el("div");
      append(root, inner);
      drawReport(inner, data.report, about);
    }
  }

  // -- start ------------------------------------------------------------------------------------------
  var about = readJSON("flopscope-page") || { kind: "report" }, data = readJSON("flopscope-data");
  var root = document.getElementById("flopscope");
  root.textContent = "";
  var draw = { report: drawReport, diff: drawDiff, table: drawTable, symbolic: drawSymbolic, generation: drawGeneration,
    plan: drawPlan }[about.kind];
  draw(root, data, about);
  root.setAttribute("data-ready", "1");
