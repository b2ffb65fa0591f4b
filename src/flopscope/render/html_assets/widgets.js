/* flopscope page, part 1 of 5: helpers, the module tree, the icicle, the table (html.py joins
   widgets.js, report.js, plan.js and pages.js inside one function). */
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
  // Integers beyond 2^53 (a 70B model's FLOPs over a long run) lose digits as JavaScript numbers.
  // The data is read with the text of each number at hand (JSON.parse's source text access):
  // such an integer stays a number for arithmetic and charts, and its exact value is kept beside
  // its object (exactOf) for what the page shows as exact; sums of exact values use plus().
  var EXACT = new WeakMap();
  function readJSON(id) {
    var node = document.getElementById(id), text = node ? node.textContent : null;
    if (text === null) return null;
    if (!/[:,[]-?\d{16,}[,\]}]/.test(text)) return JSON.parse(text);  // no integer of 16 digits: no reviver (faster)
    return JSON.parse(text, function (key, value, context) {
      if (typeof value === "number" && !Number.isSafeInteger(value) && context && /^-?\d+$/.test(context.source || "")) {
        var m = EXACT.get(this);
        if (!m) { m = {}; EXACT.set(this, m); }
        m[key] = BigInt(context.source);
      }
      return value;
    });
  }
  function exactOf(obj, key) {  // obj[key], exact (a BigInt) where the data's integer was beyond 2^53
    var m = EXACT.get(obj);
    return m && m[key] !== undefined ? m[key] : obj[key];
  }
  function plus(a, b) {  // an exact sum of integers: a BigInt once it is beyond 2^53
    if (typeof a === "number" && typeof b === "number") {
      var s = a + b;
      if (Number.isSafeInteger(s) || !Number.isInteger(a) || !Number.isInteger(b)) return s;
    }
    return BigInt(a) + BigInt(b);
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
  // three significant digits, without an exponent (999.7 MiB is "1000 MiB", not "1.00e+3 MiB")
  function sig3(x) { return Math.abs(x) >= 999.5 ? x.toFixed(0) : x.toPrecision(3); }
  function bytes(n) {
    if (n === null || n === undefined || isNaN(n)) return "-";
    var a = Math.abs(n), i = 0;
    while (a >= 1023.5 && i < BIN.length - 1) { a /= 1024; i++; }
    return (n < 0 ? "-" : "") + (i === 0 ? String(a) : sig3(a)) + " " + BIN[i];
  }
  function secs(s) {
    if (s === null || s === undefined || isNaN(s)) return "-";
    var a = Math.abs(s);
    if (a === 0) return "0 s";
    if (a < 1e-6) return sig3(s * 1e9) + " ns";
    if (a < 1e-3) return sig3(s * 1e6) + " \u00b5s";
    if (a < 1) return sig3(s * 1e3) + " ms";
    return sig3(s) + " s";
  }
  function pct(part, whole) { return whole ? (100 * part / whole).toFixed(1) + "%" : "-"; }
  function exact(n) { return typeof n === "number" || typeof n === "bigint" ? n.toLocaleString("en-US") : String(n); }
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
            self: { macs: 0, flops: 0, bytes: 0 }, incl: null, own: { macs: 0, flops: 0, bytes: 0 }, exact: null };
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
      n.own.macs = plus(n.own.macs, exactOf(r, "macs")); n.own.flops = plus(n.own.flops, exactOf(r, "flops"));
      n.own.bytes = plus(n.own.bytes, plus(exactOf(r, "bytes_read"), exactOf(r, "bytes_written")));
    });
    var order = [];
    (function walk(n) { order.push(n); n.children.forEach(walk); })(nodes.get(""));
    for (var i = order.length - 1; i >= 0; i--) {
      var n = order[i];
      n.incl = { macs: n.self.macs, flops: n.self.flops, bytes: n.self.bytes };
      n.exact = { macs: n.own.macs, flops: n.own.flops, bytes: n.own.bytes };  // inclusive, exact
      n.children.forEach(function (c) {
        n.incl.macs += c.incl.macs; n.incl.flops += c.incl.flops; n.incl.bytes += c.incl.bytes;
        n.exact.macs = plus(n.exact.macs, c.exact.macs); n.exact.flops = plus(n.exact.flops, c.exact.flops);
        n.exact.bytes = plus(n.exact.bytes, c.exact.bytes);
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
      m.exact = m.incl ? m.value : function (n) { return n.exact[m.key]; };
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
    if (opts.legend) {
      append(legend, opts.legend.map(function (l) { return el("span", {}, [el("i", { style: "background:" + l[0] }), l[1]]); }));
    } else if (bound) {
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
      if (opts.colour) return opts.colour(n);
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
        var g = sv("g", { cls: "node", "data-path": n.path, "data-value": String(m.exact(n)), "data-colour": colour(n),
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
    window.addEventListener("resize", function () { if (svg.isConnected) draw(); });
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
    var drawn = [];
    if (opts.onRow) {  // a click on a row: the row's data
      tbl.classList.add("pick");
      tbody.addEventListener("click", function (ev) {
        var tr = ev.target.closest("tr");
        if (tr && drawn[Number(tr.getAttribute("data-i"))]) opts.onRow(drawn[Number(tr.getAttribute("data-i"))]);
      });
    }
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
      drawn = shown.slice(0, MAX_ROWS);
      drawn.forEach(function (r, i) {
        html.push("<tr data-i=\"" + i + "\"" + (r._cls ? ' class="' + r._cls + '"' : "") + ">");
        columns.forEach(function (c) {
          var v = r[c.key], shown = c.fmt ? c.fmt(v, r) : (v === null || v === undefined ? "-" : String(v));
          var cls = (c.num ? "" : "text") + (c.cls ? " " + c.cls(v, r) : "");
          html.push("<td" + (cls.trim() ? ' class="' + cls.trim() + '"' : "") +
                    (c.num && typeof v === "number" ? ' title="' + exact(r._exact && r._exact[c.key] !== undefined ? r._exact[c.key] : v) + '"' : "") +
                    ">" + esc(shown) + "</td>");
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

