/* flopscope's report page: draws the JSON embedded in the page (the report's own dict), with the
   DOM and SVG only. Nothing is fetched; no library is used. */
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";

  // -- small helpers ---------------------------------------------------------------------------
  function el(tag, attrs, kids) {
    var e = document.createElement(tag);
    setAttrs(e, attrs);
    append(e, kids);
    return e;
  }
  function sv(tag, attrs, kids) {
    var e = document.createElementNS(SVG, tag);
    setAttrs(e, attrs);
    append(e, kids);
    return e;
  }
  function setAttrs(e, attrs) {
    if (!attrs) return;
    Object.keys(attrs).forEach(function (k) {
      var v = attrs[k];
      if (v === null || v === undefined || v === false) return;
      if (k === "text") e.textContent = v;
      else if (k === "cls") e.setAttribute("class", v);
      else if (k.slice(0, 2) === "on") e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    });
  }
  function append(e, kids) {
    if (kids === null || kids === undefined) return;
    if (!Array.isArray(kids)) kids = [kids];
    kids.forEach(function (k) {
      if (k === null || k === undefined || k === false) return;
      e.appendChild(typeof k === "string" ? document.createTextNode(k) : k);
    });
  }
  function readJSON(id) {
    var node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }
  var SI = ["", "k", "M", "G", "T", "P", "E", "Z", "Y", "R", "Q"];
  var BIN = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"];
  function human(n, unit) {  // counts: SI prefixes, three significant digits
    if (n === null || n === undefined || isNaN(n)) return "-";
    var a = Math.abs(n), i = 0;
    while (a >= 999.5 && i < SI.length - 1) { a /= 1000; i++; }
    var s = i === 0 ? String(Math.round(Math.abs(n) * 100) / 100) : a.toPrecision(3);
    return (n < 0 ? "-" : "") + s + (unit || i ? " " + SI[i] + (unit || "") : "");
  }
  function bytes(n) {
    if (n === null || n === undefined || isNaN(n)) return "-";
    var a = Math.abs(n), i = 0;
    while (a >= 1023.5 && i < BIN.length - 1) { a /= 1024; i++; }
    return (n < 0 ? "-" : "") + (i === 0 ? String(a) : a.toPrecision(3)) + " " + BIN[i];
  }
  function secs(s) {
    if (s === null || s === undefined || isNaN(s)) return "-";
    var a = Math.abs(s);
    if (a === 0) return "0 s";
    if (a < 1e-6) return (s * 1e9).toPrecision(3) + " ns";
    if (a < 1e-3) return (s * 1e6).toPrecision(3) + " \u00b5s";
    if (a < 1) return (s * 1e3).toPrecision(3) + " ms";
    return s.toPrecision(3) + " s";
  }
  function pct(part, whole) { return whole ? (100 * part / whole).toFixed(1) + "%" : "-"; }
  function exact(n) { return typeof n === "number" ? n.toLocaleString("en-US") : String(n); }
  function shortOp(op) { return op.replace(/^aten\./, "").replace(/\.default$/, ""); }
  function parentOf(path) { var i = path.lastIndexOf("."); return i < 0 ? "" : path.slice(0, i); }
  var tip = null;
  function showTip(ev, text) {
    if (!tip) { tip = el("div", { cls: "tip", id: "fs-tip" }); document.body.appendChild(tip); }
    tip.textContent = text;
    tip.style.display = "block";
    var x = Math.min(ev.clientX + 14, window.innerWidth - 470);
    tip.style.left = x + "px";
    tip.style.top = (ev.clientY + 14) + "px";
  }
  function hideTip() { if (tip) tip.style.display = "none"; }

  // -- the module tree from the report's modules and records -------------------------------------
  function buildTree(rep) {
    var nodes = new Map();
    function get(path) {
      var n = nodes.get(path);
      if (n) return n;
      n = { path: path, name: path === "" ? "(root)" : path.slice(path.lastIndexOf(".") + 1),
            type: "", calls: 0, params: 0, depth: 0, children: [], parent: null,
            self: { macs: 0, flops: 0, bytes: 0 }, incl: null };
      nodes.set(path, n);
      if (path !== "") {
        var p = get(parentOf(path));
        n.parent = p; n.depth = p.depth + 1; p.children.push(n);
      }
      return n;
    }
    get("");
    (rep.modules || []).forEach(function (m) {
      var n = get(m.path);
      n.type = m.type; n.calls = m.calls; n.params = m.params ? m.params.inclusive : 0;
    });
    (rep.records || []).forEach(function (r) {
      var n = get(r.module);
      n.self.macs += r.macs; n.self.flops += r.flops; n.self.bytes += r.bytes_read + r.bytes_written;
    });
    var order = [];
    (function walk(n) { order.push(n); n.children.forEach(walk); })(nodes.get(""));
    for (var i = order.length - 1; i >= 0; i--) {
      var n = order[i];
      n.incl = { macs: n.self.macs, flops: n.self.flops, bytes: n.self.bytes };
      n.children.forEach(function (c) {
        n.incl.macs += c.incl.macs; n.incl.flops += c.incl.flops; n.incl.bytes += c.incl.bytes;
      });
    }
    return { root: nodes.get(""), nodes: nodes, order: order };
  }

  // what the icicle can be sized by: counts always, times where a section holds them
  function measures(rep, tree) {
    var out = [
      { key: "flops", label: "FLOPs", fmt: function (v) { return human(v, "FLOP"); } },
      { key: "macs", label: "MACs", fmt: function (v) { return human(v, "MAC"); } },
      { key: "bytes", label: "bytes read + written", fmt: bytes }
    ];
    function fromSection(key, label, table, field) {
      if (!table) return;
      var incl = new Map();
      tree.order.forEach(function (n) {
        var row = table[n.path];
        incl.set(n.path, row && typeof row[field] === "number" ? row[field] : 0);
      });
      out.push({ key: key, label: label, fmt: secs, incl: incl });
    }
    if (rep.estimate) fromSection("estimate", "estimated time (roofline)", rep.estimate.by_module, "time_s");
    if (rep.measured) fromSection("measured", "measured time", rep.measured.by_module, "seconds");
    out.forEach(function (m) {
      m.value = m.incl ? function (n) { return m.incl.get(n.path) || 0; }
                       : function (n) { return n.incl[m.key]; };
      m.self = m.incl ? function (n) {
        var v = m.value(n);
        n.children.forEach(function (c) { v -= m.value(c); });
        return Math.max(v, 0);
      } : function (n) { return n.self[m.key]; };
    });
    return out;
  }

  // -- the icicle ---------------------------------------------------------------------------------
  var DEPTH_COLOURS = ["#8fb3e0", "#a7c7a0", "#e3c48d", "#d9a3b8", "#b3a6d9", "#9fd0cf", "#d8b49a"];
  function icicle(host, rep, tree, opts) {
    var ms = measures(rep, tree);
    var bound = rep.estimate ? rep.estimate.by_module : null;
    var state = { measure: ms[0], focus: tree.root };
    var wrap = el("div", { cls: "icicle-wrap" });
    var select = el("select", { id: opts.id + "-measure", "aria-label": "size by" },
      ms.map(function (m) { return el("option", { value: m.key, text: m.label }); }));
    select.addEventListener("change", function () {
      state.measure = ms.filter(function (m) { return m.key === select.value; })[0];
      draw();
    });
    var crumbs = el("div", { cls: "crumbs" });
    var svg = sv("svg", { cls: "icicle", id: opts.id, role: "img" });
    var legend = el("div", { cls: "legend" });
    if (bound) {
      append(legend, [el("span", {}, [el("i", { style: "background:var(--compute)" }), "compute-bound"]),
        el("span", {}, [el("i", { style: "background:var(--memory)" }), "memory-bound"]),
        el("span", {}, [el("i", { style: "background:var(--other)" }), "no work"]),
        el("span", { text: "(under the roofline estimate on " + rep.estimate.hardware.name + ")" })]);
    } else {
      append(legend, el("span", { text: "colour: depth in the module tree" }));
    }
    append(wrap, [el("div", { cls: "controls" }, [el("label", { text: "size by" }), select,
      el("button", { text: "reset zoom", onclick: function () { zoom(tree.root); } })]),
      crumbs, svg, legend]);
    append(host, wrap);
    function colour(n) {
      if (bound) {
        var b = bound[n.path] && bound[n.path].bound;
        return b === "compute" ? "var(--compute)" : b === "memory" ? "var(--memory)" : "var(--other)";
      }
      return DEPTH_COLOURS[n.depth % DEPTH_COLOURS.length];
    }
    function zoom(n) { state.focus = n; draw(); }
    function draw() {
      var m = state.measure, f = state.focus;
      var width = Math.max(host.clientWidth || 0, 600), rowH = 24;
      var total = m.value(f), rootTotal = m.value(tree.root);
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      svg.setAttribute("data-focus", f.path);
      svg.setAttribute("data-measure", m.key);
      var rows = 0, drawn = 0;
      function place(n, x, w, level) {
        if (w < 0.5 || drawn > 4000) return;
        drawn++;
        rows = Math.max(rows, level + 1);
        var v = m.value(n);
        var g = sv("g", { cls: "node", "data-path": n.path, "data-value": String(v),
                          transform: "translate(" + x.toFixed(2) + "," + (level * rowH) + ")" });
        append(g, sv("rect", { width: Math.max(w - 0.5, 0.5).toFixed(2), height: rowH - 1, fill: colour(n) }));
        if (w > 46) {
          var label = n.name + (n.type && n.path ? " \u00b7 " + n.type : "") + "  " + m.fmt(v);
          var chars = Math.floor((w - 8) / 6.2);
          append(g, sv("text", { x: 4, y: 16, text: label.length > chars ? label.slice(0, Math.max(chars - 1, 1)) + "\u2026" : label }));
        }
        g.addEventListener("click", function (ev) { ev.stopPropagation(); zoom(n === state.focus && n.parent ? n.parent : n); });
        g.addEventListener("mousemove", function (ev) {
          var b = bound && bound[n.path];
          showTip(ev, (n.path || "(root)") + (n.type ? "  (" + n.type + ")" : "") +
            "\ninclusive: " + m.fmt(v) + "  (" + pct(v, rootTotal) + " of the model)" +
            "\nself: " + m.fmt(m.self(n)) +
            (n.params ? "\nparameters: " + human(n.params) : "") +
            (n.calls ? "\ncalls: " + n.calls : "") +
            (b ? "\nestimate: " + secs(b.time_s) + ", " + b.bound + "-bound, intensity " +
                 (b.intensity === null ? "-" : b.intensity.toFixed(1)) + " FLOP/B" : "") +
            "\nclick to " + (n === state.focus ? "zoom out" : "zoom in"));
        });
        g.addEventListener("mouseleave", hideTip);
        svg.appendChild(g);
        if (!v) return;
        var cx = x;
        n.children.forEach(function (c) {
          var cw = w * m.value(c) / v;
          place(c, cx, cw, level + 1);
          cx += cw;
        });
      }
      place(f, 0, width, 0);
      if (!total) {
        svg.appendChild(sv("text", { x: 8, y: rowH + 16, text: "no " + m.label + " here" }));
        rows = Math.max(rows, 2);
      }
      svg.setAttribute("viewBox", "0 0 " + width + " " + (rows * rowH));
      svg.setAttribute("height", String(rows * rowH));
      while (crumbs.firstChild) crumbs.removeChild(crumbs.firstChild);
      var chain = [];
      for (var n = f; n; n = n.parent) chain.unshift(n);
      chain.forEach(function (c, i) {
        if (i) append(crumbs, " \u203a ");
        append(crumbs, c === f ? el("b", { text: c.name }) : el("a", { text: c.name, onclick: function () { zoom(c); } }));
      });
      append(crumbs, "  \u2014 " + m.fmt(total) + " (" + pct(total, rootTotal) + ")");
    }
    draw();
    window.addEventListener("resize", draw);
    return { zoom: zoom };
  }

  // -- a sortable, filterable table -----------------------------------------------------------------
  var MAX_ROWS = 1500;
  function table(host, id, columns, rows, opts) {
    opts = opts || {};
    var state = { key: opts.sort || null, asc: false, filter: "" };
    var input = el("input", { type: "search", id: id + "-filter", placeholder: "filter (text or /regex/)" });
    var count = el("span", { cls: "hint" });
    var extra = opts.controls || [];
    var thead = el("thead"), tbody = el("tbody");
    var tbl = el("table", { cls: "data", id: id }, [thead, tbody]);
    append(host, [el("div", { cls: "controls" }, [input].concat(extra, [count])), el("div", { cls: "scroll" }, tbl)]);
    var tr = el("tr");
    columns.forEach(function (c) {
      var th = el("th", { text: c.label, cls: c.num ? "" : "text", title: c.title || null, "data-key": c.key });
      th.addEventListener("click", function () {
        if (state.key === c.key) state.asc = !state.asc; else { state.key = c.key; state.asc = !c.num; }
        draw();
      });
      tr.appendChild(th);
    });
    thead.appendChild(tr);
    input.addEventListener("input", function () { state.filter = input.value; draw(); });
    function matcher() {
      var f = state.filter.trim();
      if (!f) return null;
      if (f.length > 2 && f[0] === "/" && f[f.length - 1] === "/") {
        try { var re = new RegExp(f.slice(1, -1), "i"); return function (s) { return re.test(s); }; }
        catch (e) { /* not a regex yet: match the text */ }
      }
      f = f.toLowerCase();
      return function (s) { return s.toLowerCase().indexOf(f) >= 0; };
    }
    function draw() {
      var match = matcher(), keep = opts.keep || function () { return true; };
      var shown = rows.filter(function (r) {
        if (!keep(r)) return false;
        if (!match) return true;
        return columns.some(function (c) { return !c.num && match(String(r[c.key] === undefined ? "" : r[c.key])); });
      });
      if (state.key !== null) {
        var k = state.key, s = state.asc ? 1 : -1;
        shown.sort(function (a, b) {
          var x = a[k], y = b[k];
          if (x === y) return 0;
          if (x === null || x === undefined) return 1;
          if (y === null || y === undefined) return -1;
          return (x < y ? -1 : 1) * s;
        });
      }
      Array.prototype.forEach.call(thead.querySelectorAll("th"), function (th) {
        th.className = (th.getAttribute("data-key") === state.key ? "sorted" + (state.asc ? " asc" : "") : "") +
          (columns.filter(function (c) { return c.key === th.getAttribute("data-key"); })[0].num ? "" : " text");
      });
      var html = [];
      shown.slice(0, MAX_ROWS).forEach(function (r) {
        html.push("<tr" + (r._cls ? ' class="' + r._cls + '"' : "") + ">");
        columns.forEach(function (c) {
          var v = r[c.key], shown = c.fmt ? c.fmt(v, r) : (v === null || v === undefined ? "-" : String(v));
          var cls = (c.num ? "" : "text") + (c.cls ? " " + c.cls(v, r) : "");
          html.push("<td" + (cls.trim() ? ' class="' + cls.trim() + '"' : "") +
                    (c.num && typeof v === "number" ? ' title="' + exact(v) + '"' : "") + ">" + esc(shown) + "</td>");
        });
        html.push("</tr>");
      });
      tbody.innerHTML = html.join("");
      count.textContent = shown.length > MAX_ROWS ? MAX_ROWS + " of " + shown.length + " rows shown (filter to see the rest)"
                                                    : shown.length + " of " + rows.length + " rows";
    }
    draw();
    return { redraw: draw };
  }
  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }

  // -- the roofline chart ---------------------------------------------------------------------------
  function roofline(host, rep) {
    var est = rep.estimate, hw = est.hardware, bw = hw.memory_bandwidth_gb_s * 1e9;
    var pts = Object.keys(est.by_op).map(function (op) {
      var r = est.by_op[op];
      return { op: op, x: r.intensity, y: r.time_s ? r.flops / r.time_s : 0, r: r };
    }).filter(function (p) { return p.x && p.y && p.r.bytes; });
    var measured = [];
    if (rep.measured && rep.measured.by_op) {
      measured = Object.keys(rep.measured.by_op).map(function (op) {
        var r = rep.measured.by_op[op];
        return { op: op, x: r.bytes ? r.flops / r.bytes : 0, y: r.flops_per_s || 0, r: r };
      }).filter(function (p) { return p.x && p.y; });
    }
    var dtypes = Object.keys(Object.assign({}, hw.vector_tflops || {}, hw.matrix_tflops || {}));
    var pick = dtypes.indexOf("fp32") >= 0 ? "fp32" : dtypes.indexOf("bf16") >= 0 ? "bf16" : dtypes[0];
    var select = el("select", { id: "roofline-dtype", "aria-label": "roofs of" },
      dtypes.map(function (d) { return el("option", { value: d, text: d, selected: d === pick ? "selected" : null }); }));
    var svg = sv("svg", { cls: "chart", id: "roofline", width: 760, height: 440, viewBox: "0 0 760 440" });
    append(host, [el("p", { cls: "hint", text: "Each operator at its arithmetic intensity and the FLOP rate the estimate gives it " +
      "(a bound: real kernels are slower); area by its share of the estimated time. Roofs: the memory bandwidth (" +
      human(bw, "B/s") + ") and the peaks of the chosen data type on " + hw.name + (hw.measured ? " (measured)." : " (datasheet).") +
      (measured.length ? " Hollow points: measured rates." : "")}),
      el("div", { cls: "controls" }, [el("label", { text: "roofs of" }), select]), svg]);
    select.addEventListener("change", draw);
    function draw() {
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      var d = select.value;
      var tf = est.tf32 && d === "fp32" ? "tf32" : d;
      var roofs = [];
      if (hw.matrix_tflops && hw.matrix_tflops[tf]) roofs.push({ label: tf + " matrix", peak: hw.matrix_tflops[tf] * 1e12, dash: null });
      if (hw.vector_tflops && hw.vector_tflops[d]) roofs.push({ label: d + " vector", peak: hw.vector_tflops[d] * 1e12, dash: "5,4" });
      var all = pts.concat(measured);
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
      var total = est.total.time_s || 1;
      pts.sort(function (a, b) { return b.r.time_s - a.r.time_s; });
      pts.forEach(function (p, i) {
        var rad = 3 + 22 * Math.sqrt(p.r.time_s / total);
        var c = sv("circle", { cx: X(p.x), cy: Y(p.y), r: rad.toFixed(1), cls: "point", "data-op": p.op,
          fill: p.r.bound === "compute" ? "var(--compute)" : "var(--memory)", "fill-opacity": 0.55, stroke: "#333", "stroke-width": 0.6 });
        c.addEventListener("mousemove", function (ev) {
          showTip(ev, p.op + "\n" + p.r.calls + " calls, " + human(p.r.flops, "FLOP") + ", " + bytes(p.r.bytes) +
            "\nintensity " + p.x.toFixed(2) + " FLOP/B, " + human(p.y, "FLOP/s") +
            "\nestimated " + secs(p.r.time_s) + " (" + pct(p.r.share, 1) + " of the estimate), " + p.r.bound + "-bound");
        });
        c.addEventListener("mouseleave", hideTip);
        svg.appendChild(c);
        if (i < 8) svg.appendChild(sv("text", { x: X(p.x) + rad + 2, y: Y(p.y) + 4, text: shortOp(p.op) }));
      });
      measured.forEach(function (p) {
        var c = sv("circle", { cx: X(p.x), cy: Y(p.y), r: 4, fill: "none", stroke: "#c0392b", "stroke-width": 1.4, cls: "measured-point" });
        c.addEventListener("mousemove", function (ev) {
          showTip(ev, p.op + " (measured)\n" + secs(p.r.seconds) + ", " + human(p.y, "FLOP/s") +
            (p.r.efficiency !== null && p.r.efficiency !== undefined ? ", " + (100 * p.r.efficiency).toFixed(0) + "% of its roof" : ""));
        });
        c.addEventListener("mouseleave", hideTip);
        svg.appendChild(c);
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
    if (mem.timeline && mem.timeline.index && mem.timeline.index.length) timeline(host, mem.timeline, mem);
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
    append(host, [el("h3", { text: "live memory over the run's " + tl.calls + " operator calls" }),
      el("p", { cls: "hint", text: tl.calls > n ? "The highest of every " + Math.ceil(tl.calls / n) + " calls is drawn, so the peak is exact." : "Every call." }), svg]);
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
  var PHASES = ["forward", "backward", "optimizer"];
  function headlineCards(rep) {
    var t = rep.totals, cards = [
      card("parameters", human(t.params), "params", t.params, exact(t.params)),
      card("MACs", human(t.macs, "MAC"), "macs", t.macs, exact(t.macs)),
      card("FLOPs", human(t.flops, "FLOP"), "flops", t.flops, exact(t.flops)),
      card("bytes read + written", bytes(t.bytes_read + t.bytes_written), "bytes", t.bytes_read + t.bytes_written,
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
                macs: n.incl.macs, flops: n.incl.flops, bytes: n.incl.bytes, self_flops: n.self.flops };
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
      if (!a) { a = { op: r.op, calls: 0, macs: 0, flops: 0, bytes: 0, counted: r.counted ? "yes" : "no rule" }; acc.set(r.op, a); }
      a.calls += r.calls; a.macs += r.macs; a.flops += r.flops; a.bytes += r.bytes_read + r.bytes_written;
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
  function drawReport(root, rep, about) {
    var tree = buildTree(rep);
    append(root, [el("h1", { id: "subject", text: subjectOf(rep) }),
      el("p", { cls: "sub", text: [(rep.meta && rep.meta.inputs || []).join(", ") ? "input " + rep.meta.inputs.join(", ") : "",
        rep.shape_only ? "shape-only" : "", rep.records.length + " operator records, " + tree.order.length + " modules"].filter(Boolean).join(" \u00b7 ") }),
      headlineCards(rep), phaseLine(rep)]);
    append(root, [el("h2", { text: "Warnings" })].concat(warnings(rep)));
    var ice = el("section", { id: "tree" });
    append(root, [el("h2", { text: "Where the cost sits" }), el("p", { cls: "hint",
      text: "The module tree as an icicle: each block is a module, as wide as its share of the chosen measure (itself and everything inside it). Click a block to zoom in, click it again (or a name above) to zoom out; hover for its own and inclusive values." }), ice]);
    icicle(ice, rep, tree, { id: "icicle" });
    if (rep.estimate) {
      var rl = el("section", { id: "roofline-section" });
      append(root, [el("h2", { text: "Roofline" }), rl]);
      roofline(rl, rep);
    }
    if (rep.memory) {
      var mh = el("section", { id: "memory" });
      append(root, [el("h2", { text: "Memory" }), mh]);
      memory(mh, rep.memory);
    }
    var mt = el("section"), ot = el("section");
    append(root, [el("h2", { text: "Modules" }), el("p", { cls: "hint", text: "Inclusive values (the module and everything inside it); click a header to sort." }), mt]);
    moduleTable(mt, rep, tree, "modules");
    append(root, [el("h2", { text: "Operators" }), ot]);
    opTable(ot, rep, "operators");
    otherSections(root, rep);
    append(root, [el("h2", { text: "Where these numbers come from" }), provenance(rep, about)]);
  }

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
    icicle(ia, a, ta, { id: "icicle-a" });
    icicle(ib, b, tb, { id: "icicle-b" });
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
    var sym = data.symbolic;
    append(root, [el("h1", { id: "subject", text: "flopscope symbolic: " + (data.model || "model") }),
      el("p", { cls: "sub", text: "symbols: " + Object.keys(data.symbols || {}).map(function (k) { return k + (data.hints && data.hints[k] !== undefined ? " (traced at " + data.hints[k] + ")" : ""); }).join(", ") +
        ((data.domain || []).length ? " \u00b7 domain: " + data.domain.join(", ") : "") })]);
    var dl = el("dl", { cls: "facts", id: "formulas-total" });
    ["macs", "flops", "bytes_read", "bytes_written"].forEach(function (k) {
      if (sym.total[k] !== undefined) append(dl, [el("dt", { text: k }), el("dd", {}, el("code", { text: sym.total[k] }))]);
    });
    append(root, [el("h2", { text: "Total" }), dl]);
    (data.curves || []).forEach(function (c) { curve(root, c); });
    var rows = Object.keys(sym.modules).map(function (p) { var m = sym.modules[p]; return { path: p || "(root)", macs: m.macs, flops: m.flops }; });
    var host = el("section");
    append(root, [el("h2", { text: "Per module" }), host]);
    table(host, "symbolic-modules", [{ key: "path", label: "module", num: false }, { key: "macs", label: "MACs", num: false }, { key: "flops", label: "FLOPs", num: false }], rows, {});
    var ops = Object.keys(sym.ops).map(function (o) { return { op: o, macs: sym.ops[o].macs, flops: sym.ops[o].flops }; });
    var oh = el("section");
    append(root, [el("h2", { text: "Per operator" }), oh]);
    table(oh, "symbolic-ops", [{ key: "op", label: "operator", num: false }, { key: "macs", label: "MACs", num: false }, { key: "flops", label: "FLOPs", num: false }], ops, {});
    var v = (about && about.versions) || {};
    append(root, el("p", { cls: "hint", text: "made " + (about && about.created) + " with " + Object.keys(v).map(function (k) { return k + " " + v[k]; }).join(", ") }));
  }
  function curve(root, c) {  // {symbol, field, points: [[x, y], ...], fixed: {...}}
    var svg = sv("svg", { cls: "chart", width: 760, height: 300, viewBox: "0 0 760 300", "data-symbol": c.symbol });
    var L = 80, R = 740, T = 12, B = 260, P = c.points;
    var xs = P.map(function (p) { return p[0]; }), ys = P.map(function (p) { return p[1]; });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs), y1 = Math.max.apply(null, ys.concat([1]));
    function X(v) { return L + (R - L) * (v - x0) / ((x1 - x0) || 1); }
    function Y(v) { return B - (B - T) * v / y1; }
    append(svg, [sv("line", { cls: "axis", x1: L, x2: R, y1: B, y2: B }), sv("line", { cls: "axis", x1: L, x2: L, y1: T, y2: B }),
      sv("path", { d: P.map(function (p, i) { return (i ? "L" : "M") + X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); }).join(" "), fill: "none", stroke: "var(--memory)", "stroke-width": 2 }),
      sv("text", { x: L, y: B + 16, "text-anchor": "middle", text: human(x0) }), sv("text", { x: R, y: B + 16, "text-anchor": "middle", text: human(x1) }),
      sv("text", { x: (L + R) / 2, y: B + 32, "text-anchor": "middle", text: c.symbol }),
      sv("text", { x: L - 6, y: T + 8, "text-anchor": "end", text: human(y1) }), sv("text", { x: L - 6, y: B, "text-anchor": "end", text: "0" })]);
    P.forEach(function (p) {
      var dot = sv("circle", { cx: X(p[0]), cy: Y(p[1]), r: 3, fill: "var(--memory)" });
      dot.addEventListener("mousemove", function (ev) { showTip(ev, c.symbol + " = " + exact(p[0]) + "\n" + c.field + " = " + human(p[1]) + " (" + exact(p[1]) + ")"); });
      dot.addEventListener("mouseleave", hideTip);
      svg.appendChild(dot);
    });
    var others = Object.keys(c.fixed || {}).map(function (k) { return k + " = " + c.fixed[k]; }).join(", ");
    append(root, [el("h3", { text: c.field + " against " + c.symbol + (others ? " (" + others + ")" : "") }), svg]);
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
  var draw = { report: drawReport, diff: drawDiff, table: drawTable, symbolic: drawSymbolic, generation: drawGeneration }[about.kind];
  draw(root, data, about);
  root.setAttribute("data-ready", "1");
})();
