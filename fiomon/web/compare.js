/*
 * fiomon compare's page: two runs side by side over aligned time (see
 * fiomon/offline/compare/page.py for the embedded document). Drawing is ECharts'
 * (vendored); this file only shapes the document into chart options.
 *
 * Never misleading: a window is drawn over its own span (a step, a band as wide as the
 * window), windows a run lacks leave a gap, and an interval side the data cannot bound
 * (null) runs to the axis' edge (open), never to 0 or an invented number. A percentile has
 * one colour (fiomon/palette.py): the candidate solid, the baseline dashed and lighter.
 *
 * After each draw the page publishes what its charts hold, read back from the charts
 * (chart.getOption()), as `window.fiomonState`, and `window.fiomonRenderer` has the charts
 * and resizeAll(), as the plot page does (tests/browser.py reads both).
 */
(function (global) {
  "use strict";

  var GROUP = "fiomon-compare";
  var RUNS = ["baseline", "candidate"];

  function fmtNs(ns) {
    if (ns === null || ns === undefined || !isFinite(ns)) return "-";
    if (ns >= 1e9) return (ns / 1e9).toPrecision(3) + " s";
    if (ns >= 1e6) return (ns / 1e6).toPrecision(3) + " ms";
    if (ns >= 1e3) return (ns / 1e3).toPrecision(3) + " µs";
    return ns.toFixed(0) + " ns";
  }

  function fmtRatio(r) {
    return r === null || r === undefined ? "-" : Number(r).toPrecision(3);
  }

  function escapeHtml(text) {
    return String(text).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }

  /* A positive number scaled, or null (a log axis cannot place 0 or less). */
  function pos(v, scale) {
    return v === null || v === undefined || !(v > 0) ? null : v / scale;
  }

  /* Step points of per-window values: each window a flat segment over [start, end], a
     null point where windows are missing (the line breaks). */
  function steps(start, end, values) {
    var out = [];
    for (var i = 0; i < start.length; i++) {
      if (i > 0 && start[i] > end[i - 1]) out.push([(end[i - 1] + start[i]) / 2, null]);
      out.push([start[i], values[i]]);
      out.push([end[i], values[i]]);
    }
    return out;
  }

  /* Lowest and highest finite positive numbers of some arrays (null: none). */
  function extent(arrays) {
    var lo = Infinity, hi = -Infinity;
    arrays.forEach(function (a) {
      a.forEach(function (v) {
        if (v !== null && v !== undefined && v > 0 && isFinite(v)) {
          lo = Math.min(lo, v);
          hi = Math.max(hi, v);
        }
      });
    });
    return isFinite(lo) ? [lo, hi] : null;
  }

  /* A log axis' range around [lo, hi]: whole decades (`decades`: latencies, labelled at
     powers of ten), else a little padding (ratios near 1: the ends labelled). */
  function logRange(ext, decades) {
    if (!ext) return [0.1, 10];
    var lo = ext[0], hi = ext[1];
    if (decades) return [Math.pow(10, Math.floor(Math.log10(lo))), Math.pow(10, Math.ceil(Math.log10(hi)))];
    var pad = Math.max(1.08, Math.pow(hi / lo, 0.08));
    return [lo / pad, hi * pad];
  }

  /* Per-window interval bands: one rectangle per window over [start, end]; a null side
     runs to the plot area's edge (open), a window with no value draws nothing.
     data: [start, end, low, high, value] in axis units. */
  function bandSeries(id, name, data, colour, opacity) {
    return {
      id: id, name: name, type: "custom", data: data, z: 1, silent: true, clip: true,
      tooltip: { show: false }, itemStyle: { color: colour }, encode: { x: [0, 1], y: [2, 3] },
      renderItem: function (params, api) {
        var d = data[params.dataIndex];
        if (d[4] === null) return null;
        var rect = params.coordSys;  // {x, y, width, height}
        var x0 = api.coord([d[0], 1])[0], x1 = api.coord([d[1], 1])[0];
        var yTop = d[3] === null ? rect.y : api.coord([d[0], d[3]])[1];
        var yBot = d[2] === null ? rect.y + rect.height : api.coord([d[0], d[2]])[1];
        return {
          type: "rect", shape: { x: x0, y: yTop, width: Math.max(1, x1 - x0), height: yBot - yTop },
          style: { fill: colour, opacity: opacity },
        };
      },
    };
  }

  function Page(doc, data) {
    this.doc = doc;
    this.data = data;
    this.colours = data.colours;
    this.charts = {};
    this.order = [];
    this.container = doc.getElementById("charts");
    this.direction = null;
    this.scope = "cluster";
    var self = this;
    this.series = {};
    data.series.forEach(function (s) {
      self.series[[s.run, s.scope, s.host || "", s.direction].join("|")] = s;
    });
    this.dirSelect = doc.getElementById("direction");
    this.dirSelect.addEventListener("change", function () {
      self.direction = self.dirSelect.value;
      self.draw();
    });
    this.scopeSelect = doc.getElementById("scope");
    this.scopeSelect.addEventListener("change", function () {
      self.scope = self.scopeSelect.value;
      self.draw();
    });
    global.addEventListener("resize", function () { self.resizeAll(); });
    global.fiomonRenderer = this;
  }

  Page.prototype.colour = function (k) {
    return (this.colours.percentiles || {})[k] || "#888888";
  };

  /* The series of `run` in the current scope and direction (undefined: none). */
  Page.prototype.get = function (run) {
    var host = this.scope === "cluster" ? "" : this.scope.slice(5);
    var scope = this.scope === "cluster" ? "cluster" : "host";
    return this.series[[run, scope, host, this.direction].join("|")];
  };

  Page.prototype.ratiosOf = function () {
    var host = this.scope === "cluster" ? null : this.scope.slice(5);
    var scope = this.scope === "cluster" ? "cluster" : "host";
    var d = this.direction;
    var out = {};
    this.data.ratios.forEach(function (r) {
      if (r.scope === scope && (r.host || null) === host && r.direction === d) out[r.percentile] = r;
    });
    return out;
  };

  Page.prototype.where = function () {
    return this.direction + ", " + (this.scope === "cluster" ? "cluster" : "host " + this.scope.slice(5));
  };

  Page.prototype.chart = function (id, cls) {
    if (this.charts[id]) return this.charts[id];
    var h = this.doc.createElement("h2");
    h.id = "title-" + id;
    var el = this.doc.createElement("div");
    el.className = "chart " + cls;
    el.id = "chart-" + id;
    this.container.appendChild(h);
    this.container.appendChild(el);
    var c = global.echarts.init(el, null, { renderer: "canvas" });
    c.group = GROUP;
    this.charts[id] = c;
    this.order.push(id);
    return c;
  };

  Page.prototype.setTitle = function (id, text) {
    this.doc.getElementById("title-" + id).textContent = text;
  };

  Page.prototype.timeAxis = function () {
    return {
      type: "value", name: "aligned time (s)", nameLocation: "middle", nameGap: 24,
      min: this.t0, max: this.t1, axisLabel: { hideOverlap: true },
    };
  };

  Page.prototype.zoom = function () {
    return [{ type: "inside", xAxisIndex: 0, filterMode: "none" }];
  };

  /* (1) Both runs' percentiles, log latency axis (ms), with their confidence bands. */
  Page.prototype.latency = function () {
    var self = this;
    var keys = this.data.percentiles;
    var lines = [], bands = [], all = [];
    RUNS.forEach(function (run) {
      var s = self.get(run);
      if (!s) return;
      var base = run === "baseline";
      keys.forEach(function (k) {
        var c = self.colour(k);
        var v = s.p[k].map(function (x) { return pos(x, 1e6); });
        var lo = s.lo[k].map(function (x) { return pos(x, 1e6); });
        var hi = s.hi[k].map(function (x) { return pos(x, 1e6); });
        all.push(v, lo, hi);
        lines.push({
          id: run + "-p" + k, name: "p" + k + " " + run, type: "line", showSymbol: false,
          connectNulls: false, sampling: "none", z: base ? 3 : 4, color: c,
          itemStyle: { color: c, opacity: base ? 0.75 : 1 },
          lineStyle: { color: c, width: base ? 1.6 : 2.2, type: base ? "dashed" : "solid", opacity: base ? 0.75 : 1 },
          data: steps(s.start, s.end, v),
        });
        bands.push(bandSeries(run + "-band-" + k, run + " bands",
          s.start.map(function (st, i) { return [st, s.end[i], lo[i], hi[i], v[i]]; }),
          c, base ? 0.08 : 0.2));
      });
    });
    var range = logRange(extent(all), true);
    var c = this.chart("latency", "");
    var kind = this.data.latency && this.data.latency !== "clat" ? " · " + this.data.latency : "";
    this.setTitle("latency", "latency percentiles, " + this.where() + kind +
      ": candidate solid, baseline dashed; bands: " + Math.round(this.data.level * 100) +
      " % confidence intervals (open where a side is unbounded)");
    c.setOption({
      animation: false,
      tooltip: { trigger: "axis", valueFormatter: function (v) { return v === null || v === undefined ? "-" : fmtNs(v * 1e6); } },
      // Plain: a narrow page wraps the legend onto a second line (the grid leaves room).
      legend: { top: 0, data: lines.map(function (l) { return l.name; }).concat([
        { name: "candidate bands", itemStyle: { color: "#999999", opacity: 0.55 } },
        { name: "baseline bands", itemStyle: { color: "#999999", opacity: 0.25 } }]) },
      grid: { left: 64, right: 30, top: 58, bottom: 40 },
      xAxis: this.timeAxis(),
      yAxis: { type: "log", name: "latency (ms)", nameLocation: "middle", nameGap: 46, min: range[0], max: range[1],
               axisLabel: { formatter: function (v) { return String(Number(v.toPrecision(3))); } } },
      dataZoom: this.zoom(),
      series: lines.concat(bands),
    }, { notMerge: true });
  };

  /* (2) Per percentile: candidate/baseline with its interval on a log axis, a line at 1,
     the significant windows shaded (red: slower, green: faster). */
  Page.prototype.ratio = function (k, r) {
    var colour = this.colour(k);
    var id = "ratio-" + k;
    var c = this.chart(id, "ratio");
    var cols = this.colours;
    var level = Math.round(this.data.level * 100);
    this.setTitle(id, "p" + k + " candidate / baseline, " + this.where() + ", with its " + level +
      " % interval; shaded: significant (red: candidate slower, green: faster)");
    var ratio = r ? r.ratio.map(function (x) { return pos(x, 1); }) : [];
    var lo = r ? r.lo.map(function (x) { return pos(x, 1); }) : [];
    var hi = r ? r.hi.map(function (x) { return pos(x, 1); }) : [];
    var areas = [];
    if (r) {
      r.significant.forEach(function (sig, i) {
        if (!sig || r.ratio[i] === null) return;
        var worse = r.ratio[i] > 1;
        areas.push([{ xAxis: r.start[i], name: worse ? "slower" : "faster",
                      itemStyle: { color: worse ? cols.regression : cols.improvement, opacity: 0.16 } },
                    { xAxis: r.end[i] }]);
      });
    }
    var ext = extent([ratio, lo, hi, [1]]);
    var range = logRange(ext);
    var series = [{
      id: "ratio-p" + k, name: "p" + k + " ratio", type: "line", showSymbol: false,
      connectNulls: false, sampling: "none", z: 4, color: colour,
      itemStyle: { color: colour }, lineStyle: { color: colour, width: 2 },
      data: r ? steps(r.start, r.end, ratio) : [],
      markLine: { symbol: "none", silent: true, animation: false, data: [{ yAxis: 1 }],
                  lineStyle: { color: "#000000", type: "solid", width: 1 }, label: { show: false } },
      markArea: { silent: true, data: areas },
    }];
    if (r) {
      series.push(bandSeries("ratio-band-" + k, "p" + k + " interval",
        r.start.map(function (st, i) { return [st, r.end[i], lo[i], hi[i], ratio[i]]; }), colour, 0.22));
    }
    c.setOption({
      animation: false,
      tooltip: { trigger: "axis", valueFormatter: fmtRatio },
      grid: { left: 64, right: 30, top: 12, bottom: 34 },
      xAxis: this.timeAxis(),
      yAxis: { type: "log", name: "ratio", nameLocation: "middle", nameGap: 46, min: range[0], max: range[1],
               axisLabel: { formatter: function (v) { return String(Number(v.toPrecision(2))); } } },
      dataZoom: this.zoom(),
      series: series,
    }, { notMerge: true });
  };

  /* (3) Both runs' IOPS. */
  Page.prototype.iops = function () {
    var self = this;
    var series = [];
    RUNS.forEach(function (run) {
      var s = self.get(run);
      if (!s) return;
      var base = run === "baseline";
      var colour = base ? self.colours.baseline_iops : self.colours.candidate_iops;
      series.push({
        id: run + "-iops", name: "IOPS " + run, type: "line", showSymbol: false, connectNulls: false,
        color: colour, itemStyle: { color: colour },
        lineStyle: { color: colour, width: base ? 1.6 : 2, type: base ? "dashed" : "solid" },
        data: steps(s.start, s.end, s.iops),
      });
    });
    var c = this.chart("iops", "iops");
    this.setTitle("iops", "IOPS, " + this.where() + ": candidate solid, baseline dashed");
    c.setOption({
      animation: false,
      tooltip: { trigger: "axis" },
      legend: { top: 0 },
      grid: { left: 64, right: 30, top: 36, bottom: 40 },
      xAxis: this.timeAxis(),
      yAxis: { type: "value", name: "IOPS", nameLocation: "middle", nameGap: 46, min: 0 },
      dataZoom: this.zoom(),
      series: series,
    }, { notMerge: true });
  };

  Page.prototype.header = function () {
    var d = this.data;
    var rows = d.runs.map(function (r) {
      var hosts = r.hosts.length > 6 ? r.hosts.slice(0, 6).join(", ") + " and " + (r.hosts.length - 6) + " more" : r.hosts.join(", ");
      return "<tr><td>" + r.name + "</td><td>" + escapeHtml(r.spec) + '</td><td class="num">' + r.files +
        '</td><td class="num">' + r.ios.toLocaleString("en") + "</td><td>" + r.hosts.length +
        (hosts ? ": " + escapeHtml(hosts) : "") + "</td><td>" + escapeHtml(r.start) + "</td><td>" +
        escapeHtml(r.alignment) + (r.late_records ? "; " + r.late_records + " late records" : "") + "</td></tr>";
    });
    this.doc.getElementById("runs").innerHTML =
      "<tr><th>run</th><th>spec</th><th>files</th><th>I/Os</th><th>hosts</th><th>start</th><th>alignment</th></tr>" + rows.join("");
    this.doc.getElementById("settings").textContent = "window " + d.window_s + " s · quantum " +
      d.quantum_s + " s · level " + Math.round(d.level * 1000) / 10 + " % · method: " + d.method +
      " · latency " + d.latency + " · times in s from each run's alignment point";
    var notes = d.notes.length ? d.notes : ["none"];
    this.doc.getElementById("notes").innerHTML = notes.map(function (n) { return "<li>" + escapeHtml(n) + "</li>"; }).join("");
  };

  /* The whole-run verdicts of the current scope, every direction. */
  Page.prototype.whole = function () {
    var host = this.scope === "cluster" ? null : this.scope.slice(5);
    var scope = this.scope === "cluster" ? "cluster" : "host";
    var rows = this.data.whole.filter(function (v) { return v.scope === scope && (v.host || null) === host; });
    var html = rows.map(function (v) {
      var cls = v.significant ? (v.ratio > 1 ? "worse" : "better") : "";
      var ci = "[" + fmtRatio(v.ratio_ci[0]) + ", " + (v.ratio_ci[1] === null ? "∞" : fmtRatio(v.ratio_ci[1])) + "]";
      var hosts = (v.hosts || []).slice(0, 3).map(function (h) {
        return escapeHtml(h.host) + " " + Math.round(h.share * 100) + " %";
      }).join(", ");
      return '<tr class="' + cls + '"><td>' + v.direction + "</td><td>p" + v.percentile + '</td><td class="num">' +
        fmtNs(v.baseline_ns) + '</td><td class="num">' + fmtNs(v.candidate_ns) + '</td><td class="num">' +
        fmtRatio(v.ratio) + '</td><td class="num">' + ci + "</td><td>" + (v.significant ? "yes" : "no") +
        "</td><td>" + escapeHtml(v.method) + "</td><td>" + hosts + "</td></tr>";
    });
    this.doc.getElementById("whole").innerHTML = "<tr><th>direction</th><th>percentile</th><th>baseline</th>" +
      "<th>candidate</th><th>ratio</th><th>interval</th><th>significant</th><th>method</th><th>top hosts</th></tr>" +
      (html.length ? html.join("") : '<tr><td colspan="9">no whole-run lines</td></tr>');
    this.doc.getElementById("whole-title").textContent = "whole run (" +
      (scope === "cluster" ? "cluster" : "host " + host) + "), " + Math.round(this.data.level * 100) + " % intervals";
    return rows.length;
  };

  Page.prototype.draw = function () {
    var self = this;
    var d = this.data;
    var dirs = d.directions.filter(function (x) {
      return d.series.some(function (s) { return s.direction === x && s.ios.some(function (n) { return n > 0; }); });
    });
    if (!dirs.length) dirs = d.directions.slice(0, 1);
    if (!this.direction || dirs.indexOf(this.direction) < 0) {
      this.direction = dirs.indexOf("read") >= 0 ? "read" : dirs[0];
    }
    this.dirSelect.innerHTML = dirs.map(function (x) {
      return '<option value="' + x + '"' + (x === self.direction ? " selected" : "") + ">" + x + "</option>";
    }).join("");
    var scopes = ["cluster"].concat(d.hosts.map(function (h) { return "host:" + h; }));
    if (scopes.indexOf(this.scope) < 0) this.scope = "cluster";
    this.scopeSelect.innerHTML = scopes.map(function (x) {
      return '<option value="' + escapeHtml(x) + '"' + (x === self.scope ? " selected" : "") + ">" +
        escapeHtml(x === "cluster" ? "cluster" : "host " + x.slice(5)) + "</option>";
    }).join("");
    this.doc.getElementById("scope-label").hidden = d.hosts.length === 0;
    // One time span for every chart: both runs' windows in this scope and direction.
    var t0 = Infinity, t1 = -Infinity;
    RUNS.forEach(function (run) {
      var s = self.get(run);
      if (s && s.start.length) { t0 = Math.min(t0, s.start[0]); t1 = Math.max(t1, s.end[s.end.length - 1]); }
    });
    this.t0 = isFinite(t0) ? t0 : 0;
    this.t1 = isFinite(t1) ? t1 : 1;
    this.latency();
    var ratios = this.ratiosOf();
    d.percentiles.forEach(function (k) { self.ratio(k, ratios[k]); });
    this.iops();
    var whole = this.whole();
    global.echarts.connect(GROUP);
    this.publish(whole);
    this.whenRendered();
  };

  /* Whether zrender painted every element of a chart (as fiomon.js: ECharts 6.1 internals). */
  function painted(chart) {
    var layers = chart.getZr().painter.getLayers ? chart.getZr().painter.getLayers() : {};
    return Object.keys(layers).every(function (k) {
      var cursors = layers[k].__cursors;
      if (!cursors || !cursors.each) return true;
      var ok = true;
      cursors.each(function (c) { if (c.drawIdx < c.endIdx) ok = false; });
      return ok;
    });
  }

  Page.prototype.resizeAll = function () {
    if (global.fiomonState) global.fiomonState.rendered = false;
    this.whenRendered();
  };

  /* `rendered` turns true once every chart finished drawing; a screenshot waits for it. */
  Page.prototype.whenRendered = function () {
    var self = this;
    var ids = Object.keys(this.charts);
    var pending = ids.length;
    var draw = this.drawCount = (this.drawCount || 0) + 1;
    global.fiomonState.rendered = false;
    var done = function () {
      if (draw !== self.drawCount || global.fiomonState.rendered) return;
      if (!ids.every(function (id) { return painted(self.charts[id]); })) {
        global.requestAnimationFrame(done);
        return;
      }
      global.fiomonState.rendered = true;
      self.doc.body.setAttribute("data-rendered", String(draw));
    };
    ids.forEach(function (id) {
      var c = self.charts[id];
      c.off("finished");
      var once = function () {
        c.off("finished", once);
        pending -= 1;
        if (pending === 0) done();
      };
      c.on("finished", once);
      c.resize();  // a chart with nothing new to draw may not fire: a resize forces a pass
    });
    if (pending === 0) done();
  };

  /* What the charts hold, read back from them, for tests and for the curious. */
  Page.prototype.publish = function (wholeRows) {
    var self = this;
    var charts = {};
    Object.keys(this.charts).forEach(function (id) {
      var opt = self.charts[id].getOption();
      charts[id] = (opt.series || []).map(function (s) {
        var out = { id: s.id, name: s.name, type: s.type, points: (s.data || []).length, data: s.data };
        if (s.markArea && s.markArea.data) {
          out.areas = s.markArea.data.map(function (a) { return [a[0].xAxis, a[1].xAxis, a[0].name]; });
        }
        if (s.markLine && s.markLine.data) out.markLines = s.markLine.data.map(function (x) { return x.yAxis; });
        return out;
      });
    });
    var axes = {};
    Object.keys(this.charts).forEach(function (id) {
      var y = self.charts[id].getOption().yAxis[0];
      axes[id] = { type: y.type, min: y.min, max: y.max };
    });
    global.fiomonState = {
      ready: true, rendered: false, direction: this.direction, scope: this.scope,
      charts: charts, axes: axes, order: this.order.slice(), whole_rows: wholeRows,
      draws: (global.fiomonState ? global.fiomonState.draws : 0) + 1,
    };
  };

  function main(doc) {
    var data = JSON.parse(doc.getElementById("fiomon-data").textContent);
    var page = new Page(doc, data);
    page.header();
    page.draw();
    return page;
  }

  global.fiomonCompare = { main: main, steps: steps, logRange: logRange };
})(window);
