/* report.html's drawings: the GPU timeline and the host-stack flame graph (canvas), sortable tables.
   Reads the JSON block #trainprof-data written by trainprof/report/html.py; every string from a trace
   reaches the page through textContent or canvas text, never as markup. No network, no libraries. */
(function () {
  "use strict";
  var node = document.getElementById("trainprof-data");
  if (!node) return;
  var DATA = JSON.parse(node.textContent);
  var style = getComputedStyle(document.documentElement);
  function cssColor(name, fallback) { return style.getPropertyValue("--" + name).trim() || fallback; }
  var tip = document.createElement("div");
  tip.className = "tip";
  document.body.appendChild(tip);

  function showTip(lines, event) {
    tip.textContent = lines.filter(function (l) { return l; }).join("\n");
    tip.style.display = "block";
    var x = event.clientX + 14, y = event.clientY + 14;
    var w = tip.offsetWidth, h = tip.offsetHeight;
    if (x + w > window.innerWidth - 4) x = Math.max(4, event.clientX - w - 14);
    if (y + h > window.innerHeight - 4) y = Math.max(4, event.clientY - h - 14);
    tip.style.left = x + "px";
    tip.style.top = y + "px";
  }
  function hideTip() { tip.style.display = "none"; }

  function ms(us) {
    if (us >= 1000) return (us / 1000).toFixed(us >= 100000 ? 0 : 2) + " ms";
    return us.toFixed(us >= 100 ? 0 : 1) + " \u00b5s";
  }
  function cumsum(deltas) {
    var out = new Float64Array(deltas.length), total = 0;
    for (var i = 0; i < deltas.length; i++) { total += deltas[i]; out[i] = total; }
    return out;
  }
  function canvasFor(holder, height) {
    var canvas = holder.querySelector("canvas") || holder.appendChild(document.createElement("canvas"));
    var ratio = window.devicePixelRatio || 1;
    var width = Math.max(holder.clientWidth, 300);
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.height = height + "px";
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    return { canvas: canvas, ctx: ctx, width: width, height: height };
  }
  function clippedText(ctx, text, x, y, width) {
    if (width < 24) return;
    var chars = Math.floor((width - 6) / 6.2);
    if (chars < 2) return;
    ctx.fillText(text.length > chars ? text.slice(0, chars - 1) + "\u2026" : text, x + 3, y);
  }
  function niceStep(span, ticks) {
    var raw = span / ticks, power = Math.pow(10, Math.floor(Math.log10(raw)));
    var steps = [1, 2, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * power >= raw) return steps[i] * power;
    return 10 * power;
  }

  /* ---------- the GPU timeline ---------- */
  var LANE = 22, HEADER = 26, GAP = 4;

  function Timeline(holder, view) {
    this.holder = holder;
    this.view = view;
    this.strings = view.strings;
    this.lanes = view.lanes.map(function (lane) {
      var start = cumsum(lane.start);
      return { label: lane.label, start: start, dur: lane.dur, busy: lane.busy, count: lane.count,
               name: lane.name, cat: lane.cat, op: lane.op, module: lane.module, phase: lane.phase,
               kind: "gpu" };
    });
    this.lanes.push({ label: "GPU idle", start: cumsum(view.idle.start), dur: view.idle.dur,
                      idle: view.idle.idle, count: view.idle.count, cause: view.idle.cause,
                      oneoff: view.idle.one_off, kind: "idle" });
    this.lanes.push({ label: "sync points", start: Float64Array.from(view.syncs.at), dur: view.syncs.blocked,
                      op: view.syncs.op, call: view.syncs.call, kind: "sync" });
    this.catColors = DATA.categories.map(function (c) { return cssColor("cat-" + c.key, "#adb5bd"); });
    this.causeColors = DATA.causes.map(function (c) { return cssColor("cause-" + c.key, "#999"); });
    this.reset();
    this.bind();
  }
  Timeline.prototype.reset = function () { this.t0 = 0; this.t1 = Math.max(this.view.end, 1); this.draw(); };
  Timeline.prototype.zoomTo = function (a, b) {
    var pad = (b - a) * 0.02;
    this.t0 = a - pad; this.t1 = b + pad; this.draw();
  };
  Timeline.prototype.layout = function () {
    var labelWidth = 190;
    return { left: labelWidth, height: HEADER + this.lanes.length * (LANE + GAP) + 4 };
  };
  Timeline.prototype.draw = function () {
    var geo = this.layout(), c = canvasFor(this.holder, geo.height), ctx = c.ctx;
    var left = geo.left, width = c.width - left - 8, t0 = this.t0, t1 = this.t1;
    var scale = width / (t1 - t0);
    this.geo = { left: left, width: width, scale: scale, canvasWidth: c.width };
    ctx.clearRect(0, 0, c.width, c.height);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    // time axis
    var tick = niceStep(t1 - t0, Math.max(2, Math.floor(width / 110)));
    ctx.fillStyle = "#5b6475";
    ctx.strokeStyle = "#eef0f4";
    for (var t = Math.ceil(t0 / tick) * tick; t <= t1; t += tick) {
      var x = left + (t - t0) * scale;
      ctx.beginPath(); ctx.moveTo(x, HEADER - 4); ctx.lineTo(x, geo.height); ctx.stroke();
      ctx.fillText(ms(t), x + 2, 8);
    }
    // step windows
    ctx.strokeStyle = "#2457c5";
    ctx.setLineDash([4, 3]);
    for (var s = 0; s < this.view.steps.length; s++) {
      var step = this.view.steps[s], xs = left + (step[1] - t0) * scale, xe = left + (step[2] - t0) * scale;
      if (xe < left || xs > left + width) continue;
      ctx.beginPath(); ctx.moveTo(xs, 14); ctx.lineTo(xs, geo.height); ctx.stroke();
      ctx.fillStyle = "#2457c5";
      clippedText(ctx, "step " + step[0], Math.max(xs, left), 20, Math.min(xe, left + width) - Math.max(xs, left));
    }
    ctx.setLineDash([]);
    for (var l = 0; l < this.lanes.length; l++) this.drawLane(ctx, this.lanes[l], HEADER + l * (LANE + GAP));
  };
  /* The kernels' (or the idle runs') time per pixel column of the view, on the one scale every lane
     shares: a block adds its busy (idle) time to the columns it spans, in proportion. `amount[c]` is
     the µs in column c, `top[c]` the block that gave it the most (its colour and hover). */
  Timeline.prototype.columns = function (lane) {
    var g = this.geo, t0 = this.t0, t1 = this.t1, n = Math.max(Math.ceil(g.width), 1);
    var amount = new Float64Array(n), most = new Float64Array(n), top = new Int32Array(n).fill(-1);
    var share = lane.kind === "gpu" ? lane.busy : lane.idle;
    for (var i = 0; i < lane.start.length; i++) {
      var s = lane.start[i], d = lane.dur[i];
      if (s > t1 || s + d < t0) continue;
      var a = Math.max((s - t0) * g.scale, 0), b = Math.min((s + d - t0) * g.scale, n);
      var density = d > 0 ? share[i] / d : 0;  // µs of work (idle) per µs of the block
      for (var c = Math.floor(a); c < b && c < n; c++) {
        var part = (Math.min(b, c + 1) - Math.max(a, c)) / g.scale * density;
        if (d <= 0) part = share[i];
        amount[c] += part;
        if (part > most[c]) { most[c] = part; top[c] = i; }
      }
    }
    return { amount: amount, top: top };
  };
  /* Columns drawn so that the drawn share stays true to scale: a column is filled when the time
     carried into it reaches half a column, and what it over- or under-draws carries to the next
     (error diffusion). Tiny gaps and kernels merge into whole pixels; none is inflated to one. */
  Timeline.prototype.drawLane = function (ctx, lane, y) {
    var g = this.geo;
    ctx.fillStyle = "#f6f8fb";
    ctx.fillRect(g.left, y, g.width, LANE);
    if (lane.kind === "sync") { this.drawSyncs(ctx, lane, y); this.label(ctx, lane, y, ""); return; }
    var cols = this.columns(lane), usPerColumn = 1 / g.scale, carry = 0, total = 0;
    var self = this, runColor = null, runStart = 0, runAlpha = 1;
    var pad = lane.kind === "gpu" ? 2 : 4;
    function flush(end) {
      if (runColor !== null && end > runStart) {
        ctx.globalAlpha = runAlpha; ctx.fillStyle = runColor;
        ctx.fillRect(g.left + runStart, y + pad, end - runStart, LANE - 2 * pad);
      }
      runColor = null;
    }
    for (var c = 0; c < cols.amount.length; c++) {
      var filled = Math.min(cols.amount[c] / usPerColumn, 1);
      total += cols.amount[c];
      carry += filled;
      var color = null, alpha = 1;
      if (carry >= 0.5 && cols.top[c] >= 0) {
        carry -= 1;
        var i = cols.top[c];
        if (lane.kind === "gpu") { color = self.catColors[lane.cat[i]]; alpha = lane.count[i] > 1 ? 0.7 : 1; }
        else { color = self.causeColors[lane.cause[i]]; alpha = lane.oneoff[i] ? 0.45 : 0.9; }
      }
      if (color !== runColor || alpha !== runAlpha) { flush(c); if (color !== null) { runColor = color; runAlpha = alpha; runStart = c; } }
    }
    flush(cols.amount.length);
    ctx.globalAlpha = 1;
    if (lane.kind === "gpu") this.drawNames(ctx, lane, y);
    var inSteps = this.stepTimeInView();
    var pct = inSteps > 0 ? Math.min(100 * total / inSteps, 100) : 0;
    this.label(ctx, lane, y, (pct >= 10 ? pct.toFixed(0) : pct.toFixed(1)) + "% " + (lane.kind === "gpu" ? "busy" : "idle"));
  };
  /* The lane's name at the left, its share of the steps' time in view at the right of the label. */
  Timeline.prototype.label = function (ctx, lane, y, share) {
    var g = this.geo;
    ctx.fillStyle = "#1d2330";
    var shareWidth = share ? ctx.measureText(share).width + 8 : 0;
    clippedText(ctx, lane.label, 0, y + LANE / 2, g.left - 6 - shareWidth);
    if (share) {
      ctx.save(); ctx.font = "bold 11px system-ui, sans-serif"; ctx.textAlign = "right";
      ctx.fillText(share, g.left - 8, y + LANE / 2); ctx.restore();
    }
  };
  /* The µs of the profiled steps inside the view: what a lane's share is a share of. */
  Timeline.prototype.stepTimeInView = function () {
    var steps = this.view.steps, total = 0;
    for (var s = 0; s < steps.length; s++) total += Math.max(Math.min(steps[s][2], this.t1) - Math.max(steps[s][1], this.t0), 0);
    return total;
  };
  Timeline.prototype.drawNames = function (ctx, lane, y) {
    var g = this.geo, t0 = this.t0, t1 = this.t1;
    ctx.save();
    ctx.beginPath(); ctx.rect(g.left, y, g.width, LANE); ctx.clip();
    ctx.fillStyle = "#10141c";
    for (var i = 0; i < lane.start.length; i++) {
      var s = lane.start[i], d = lane.dur[i];
      if (s > t1 || s + d < t0 || d * g.scale <= 40) continue;
      clippedText(ctx, this.strings[lane.name[i]] || "", g.left + (s - t0) * g.scale, y + LANE / 2, d * g.scale);
    }
    ctx.restore();
  };
  Timeline.prototype.drawSyncs = function (ctx, lane, y) {
    var g = this.geo, t0 = this.t0, t1 = this.t1;
    ctx.save();
    ctx.beginPath(); ctx.rect(g.left, y, g.width, LANE); ctx.clip();
    ctx.fillStyle = "#b01c5b";
    for (var i = 0; i < lane.start.length; i++) {
      var s = lane.start[i], d = lane.dur[i];
      if (s > t1 || s + d < t0) continue;
      var x = g.left + (s - t0) * g.scale, w = Math.max(d * g.scale, 1);
      ctx.globalAlpha = 0.35;
      ctx.fillRect(x, y + 3, w, LANE - 6);
      ctx.globalAlpha = 1;  // a marker where the host blocked: a point in time, not a share
      ctx.beginPath(); ctx.moveTo(x - 4, y + 2); ctx.lineTo(x + 4, y + 2); ctx.lineTo(x, y + 9); ctx.closePath(); ctx.fill();
    }
    ctx.restore();
  };
  Timeline.prototype.hit = function (event) {
    var rect = this.holder.querySelector("canvas").getBoundingClientRect(), g = this.geo;
    var x = event.clientX - rect.left, y = event.clientY - rect.top;
    var row = Math.floor((y - HEADER) / (LANE + GAP));
    if (x < g.left || row < 0 || row >= this.lanes.length) return null;
    var lane = this.lanes[row], t = this.t0 + (x - g.left) / g.scale, slack = 2 / g.scale;
    // blocks are sorted by start: among the last one starting before the cursor (with a pixel's
    // slack) and a few before it, the one under the cursor, else the nearest
    var lo = 0, hi = lane.start.length - 1, at = -1;
    while (lo <= hi) { var mid = (lo + hi) >> 1; if (lane.start[mid] <= t + slack) { at = mid; lo = mid + 1; } else hi = mid - 1; }
    var best = -1, bestDistance = Infinity;
    for (var i = at; i >= 0 && i > at - 50; i--) {
      var distance = Math.max(lane.start[i] - t, t - (lane.start[i] + lane.dur[i]), 0);
      if (distance < bestDistance) { best = i; bestDistance = distance; }
      if (distance === 0) break;
    }
    return best >= 0 && bestDistance <= slack ? { lane: lane, index: best } : null;
  };
  Timeline.prototype.describe = function (hit) {
    var lane = hit.lane, i = hit.index, S = this.strings;
    if (lane.kind === "gpu") {
      var phase = DATA.phases[lane.phase[i]];
      var lines = [lane.count[i] > 1 ? lane.count[i] + " events joined; longest: " + S[lane.name[i]] : S[lane.name[i]],
        "category: " + DATA.categories[lane.cat[i]].label];
      if (lane.op[i] >= 0) lines.push("op: " + S[lane.op[i]] + (phase ? " (" + phase + ")" : ""));
      if (lane.module[i] >= 0) lines.push("module: " + S[lane.module[i]]);
      lines.push(lane.count[i] > 1 ? "busy " + ms(lane.busy[i]) + " of " + ms(lane.dur[i]) : "duration: " + ms(lane.dur[i]));
      return lines;
    }
    if (lane.kind === "idle") {
      var cause = DATA.causes[lane.cause[i]];
      return ["GPU idle: " + cause.key + (lane.oneoff[i] ? " (one-off)" : ""), cause.meaning,
              lane.count[i] > 1 ? ms(lane.idle[i]) + " idle in " + lane.count[i] + " gaps over " + ms(lane.dur[i])
                                : "duration: " + ms(lane.dur[i])];
    }
    return ["sync point: " + (lane.op[i] >= 0 ? S[lane.op[i]] : "?") + (lane.call[i] >= 0 ? " \u2192 " + S[lane.call[i]] : ""),
            "host blocked " + ms(lane.dur[i])];
  };
  Timeline.prototype.bind = function () {
    var self = this, drag = null;
    this.holder.addEventListener("mousemove", function (e) {
      if (drag) {
        var shift = (e.clientX - drag.x) / self.geo.scale;
        self.t0 = drag.t0 - shift; self.t1 = drag.t1 - shift; self.draw(); return;
      }
      var hit = self.hit(e);
      if (hit) showTip(self.describe(hit), e); else hideTip();
    });
    this.holder.addEventListener("mouseleave", function () { drag = null; hideTip(); });
    this.holder.addEventListener("mousedown", function (e) { drag = { x: e.clientX, t0: self.t0, t1: self.t1 }; });
    window.addEventListener("mouseup", function () { drag = null; });
    this.holder.addEventListener("dblclick", function () { self.reset(); });
    this.holder.addEventListener("wheel", function (e) {
      e.preventDefault();
      var rect = self.holder.querySelector("canvas").getBoundingClientRect(), g = self.geo;
      var at = self.t0 + (Math.min(Math.max(e.clientX - rect.left, g.left), g.left + g.width) - g.left) / g.scale;
      var factor = e.deltaY > 0 ? 1.25 : 0.8, span = (self.t1 - self.t0) * factor;
      if (span < 0.5) return;
      self.t0 = at - (at - self.t0) * factor; self.t1 = self.t0 + span; self.draw();
    }, { passive: false });
  };

  /* ---------- the flame graph (an icicle: callers above callees) ---------- */
  var ROW = 17;

  function Flame(holder, graph) {
    this.holder = holder;
    this.graph = graph;
    this.metric = "host";
    var n = graph.parent.length;
    this.children = [];
    this.depth = new Int32Array(n);
    for (var i = 0; i < n; i++) this.children.push([]);
    for (i = 1; i < n; i++) { this.children[graph.parent[i]].push(i); this.depth[i] = this.depth[graph.parent[i]] + 1; }
    this.focus = 0;
    this.bind();
  }
  Flame.prototype.value = function (i) { return this.metric === "host" ? this.graph.host[i] : this.graph.gpu[i]; };
  Flame.prototype.color = function (name) {
    if (/^(aten|c10d|cudnn|cublas|nccl)::|^autograd::/.test(name)) return cssColor("flame-op", "#6fa8dc");
    if (name.indexOf("nn.Module: ") === 0) return cssColor("flame-module", "#93c47d");
    if (/\.py\(\d+\): /.test(name) || name.indexOf("<built-in") === 0) return cssColor("flame-python", "#f2a65a");
    return cssColor("flame-other", "#c3c8d2");
  };
  Flame.prototype.draw = function () {
    var g = this.graph, self = this, boxes = [];
    // the focus's ancestors, full width, then the focus's subtree in proportion
    var chain = [], at = this.focus;
    while (at >= 0) { chain.unshift(at); at = g.parent[at]; }
    var width = Math.max(this.holder.clientWidth, 300), total = this.value(this.focus);
    chain.forEach(function (i, row) { boxes.push({ node: i, x: 0, w: width, row: row }); });
    var base = chain.length - 1, maxRow = base;
    function place(i, x, w, row) {
      var kids = self.children[i].slice().sort(function (a, b) { return self.value(b) - self.value(a); });
      var cx = x;
      kids.forEach(function (k) {
        var kw = total > 0 ? w * self.value(k) / Math.max(self.value(i), 1e-9) : 0;
        if (kw >= 0.5) {
          boxes.push({ node: k, x: cx, w: kw, row: row + 1 });
          if (row + 1 > maxRow) maxRow = row + 1;
          place(k, cx, kw, row + 1);
        }
        cx += kw;
      });
    }
    if (total > 0) place(this.focus, 0, width, base);
    var c = canvasFor(this.holder, (maxRow + 1) * ROW + 2), ctx = c.ctx;
    ctx.clearRect(0, 0, c.width, c.height);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    boxes.forEach(function (b) {
      var name = g.strings[g.name[b.node]];
      ctx.fillStyle = self.color(name);
      ctx.globalAlpha = b.row < base ? 0.55 : 1;
      ctx.fillRect(b.x, b.row * ROW, Math.max(b.w - 0.5, 0.5), ROW - 1);
      ctx.globalAlpha = 1;
      ctx.fillStyle = "#10141c";
      clippedText(ctx, name, b.x, b.row * ROW + ROW / 2, b.w);
    });
    this.boxes = boxes;
  };
  Flame.prototype.hit = function (event) {
    var rect = this.holder.querySelector("canvas").getBoundingClientRect(), x = event.clientX - rect.left, y = event.clientY - rect.top;
    var row = Math.floor(y / ROW);
    for (var i = 0; i < (this.boxes || []).length; i++) {
      var b = this.boxes[i];
      if (b.row === row && x >= b.x && x < b.x + b.w) return b.node;
    }
    return -1;
  };
  Flame.prototype.bind = function () {
    var self = this, g = this.graph;
    this.holder.addEventListener("mousemove", function (e) {
      var i = self.hit(e);
      if (i < 0) { hideTip(); return; }
      var share = function (v, all) { return all > 0 ? " (" + (100 * v / all).toFixed(1) + "%)" : ""; };
      showTip([g.strings[g.name[i]], "host " + ms(g.host[i]) + share(g.host[i], g.host[0]),
               "GPU launched beneath " + ms(g.gpu[i]) + share(g.gpu[i], g.gpu[0]), "click to zoom"], e);
    });
    this.holder.addEventListener("mouseleave", hideTip);
    this.holder.addEventListener("click", function (e) {
      var i = self.hit(e);
      if (i >= 0) { self.focus = i; self.draw(); }
    });
  };

  /* ---------- wiring ---------- */
  function setUp() {
    var traceSelect = document.getElementById("trace-select");
    var timelineHolder = document.getElementById("timeline-chart");
    var flameHolder = document.getElementById("flame-chart");
    var stepBar = document.getElementById("timeline-steps");
    var timeline = null, flame = null;

    function show(index) {
      var trace = DATA.traces[index];
      if (!trace) return;
      if (timelineHolder && trace.timeline) {
        timeline = new Timeline(timelineHolder, trace.timeline);
        stepBar.textContent = "";
        var all = document.createElement("button");
        all.textContent = "all steps";
        all.addEventListener("click", function () { timeline.reset(); });
        stepBar.appendChild(all);
        trace.timeline.steps.forEach(function (step) {
          var button = document.createElement("button");
          button.textContent = "step " + step[0];
          button.addEventListener("click", function () { timeline.zoomTo(step[1], step[2]); });
          stepBar.appendChild(button);
        });
      }
      if (flameHolder && trace.flame) {
        var old = flame ? flame.metric : "host";
        flameHolder.replaceWith(flameHolder.cloneNode(false));  // drops the old listeners
        flameHolder = document.getElementById("flame-chart");
        flame = new Flame(flameHolder, trace.flame);
        flame.metric = old;
        flame.draw();
      }
    }
    if (traceSelect) traceSelect.addEventListener("change", function () {
      if (timelineHolder) { timelineHolder.replaceWith(timelineHolder.cloneNode(false)); timelineHolder = document.getElementById("timeline-chart"); }
      show(Number(traceSelect.value));
    });
    document.querySelectorAll("[data-metric]").forEach(function (button) {
      button.addEventListener("click", function () {
        if (!flame) return;
        flame.metric = button.getAttribute("data-metric");
        document.querySelectorAll("[data-metric]").forEach(function (b) { b.classList.toggle("on", b === button); });
        flame.draw();
      });
    });
    var flameReset = document.getElementById("flame-reset");
    if (flameReset) flameReset.addEventListener("click", function () { if (flame) { flame.focus = 0; flame.draw(); } });
    show(0);
    var pending = null;
    window.addEventListener("resize", function () {
      clearTimeout(pending);
      pending = setTimeout(function () { if (timeline) timeline.draw(); if (flame) flame.draw(); }, 100);
    });
  }

  function sortable() {
    document.querySelectorAll("table.sortable").forEach(function (table) {
      var heads = table.querySelectorAll("th");
      heads.forEach(function (th, column) {
        th.classList.add("sortable");
        th.addEventListener("click", function () {
          var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
          var descending = th.getAttribute("data-order") !== "desc";
          heads.forEach(function (h) { h.removeAttribute("data-order"); });
          th.setAttribute("data-order", descending ? "desc" : "asc");
          var numeric = th.classList.contains("num");
          rows.sort(function (a, b) {
            var x = a.cells[column].getAttribute("data-v") || a.cells[column].textContent;
            var y = b.cells[column].getAttribute("data-v") || b.cells[column].textContent;
            var order = numeric ? (Number(x) || 0) - (Number(y) || 0) : x.localeCompare(y);
            return descending ? -order : order;
          });
          rows.forEach(function (r) { body.appendChild(r); });
        });
      });
    });
  }

  sortable();
  setUp();
})();
