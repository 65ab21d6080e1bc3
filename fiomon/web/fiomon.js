/*
 * fiomon charts: one renderer for the offline page (`fiomon plot`) and the live page
 * (the aggregator's `/`). Input: closed-quantum objects (the quanta file's JSON line, latencies
 * in ns) with an optional `heat` ({k0, counts}: I/Os per half-octave latency bucket, see
 * fiomon/heat.py) on cluster rows. Drawing is ECharts' (vendored, see vendor/README.md);
 * this file only shapes data into chart options.
 *
 * Never misleading: quanta missing between two rows break every line and band (and add an
 * empty heatmap column), nothing is interpolated across them; each percentile has its
 * fiomon/palette.py colour (from the page config and the API's meta); SLA lines are drawn
 * only on their own direction's chart, black, dashed and labelled.
 *
 * After each draw the page publishes what the charts hold, read back from the charts
 * themselves (chart.getOption()), as `window.fiomonState` and as JSON in
 * `<body data-state>` so a headless browser's --dump-dom shows it to tests.
 */
(function (global) {
  "use strict";

  var DIRS = ["read", "write", "trim", "mixed", "all"];  // mixed: unified_rw_reporting
  // Colours come from fiomon/palette.py through the page's config (and, live, the API's
  // meta): one colour per percentile wherever fiomon draws it. These are fallbacks only.
  var COLOURS = { sla: "#000000", mean: "#555555", saturated: "#b00020", percentiles: {} };
  var BANDS = "confidence bands";
  var VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"];
  var GROUP = "fiomon-time";

  function bucketEdgeNs(k) {
    var m = Math.floor(k / 2);
    return Math.pow(2, m) * (k % 2 ? 1.5 : 1);
  }

  function fmtNs(ns) {
    if (ns === null || ns === undefined || !isFinite(ns)) return "-";
    if (ns >= 1e9) return (ns / 1e9).toPrecision(3) + " s";
    if (ns >= 1e6) return (ns / 1e6).toPrecision(3) + " ms";
    if (ns >= 1e3) return (ns / 1e3).toPrecision(3) + " µs";
    return ns.toFixed(0) + " ns";
  }

  /* The packed document of `fiomon plot` (fiomon/offline/plotdata.py) back into row objects. */
  function unpack(doc) {
    var rows = [];
    doc.series.forEach(function (s) {
      var keys = Object.keys(s.p);
      var sat = {};
      Object.keys(s.sat || {}).forEach(function (k) { sat[k] = new Set(s.sat[k]); });
      for (var i = 0; i < s.end.length; i++) {
        var pct = {};
        var saturated = [];
        keys.forEach(function (k) {
          pct[k] = s.p[k][i];
          if (sat[k] && sat[k].has(i)) saturated.push(k);
        });
        var r = {
          start_ms: doc.t0 + s.start[i], end_ms: doc.t0 + s.end[i], scope: s.scope,
          host: s.host, direction: s.direction, samples: s.samples[i],
          percentiles_ns: pct, saturated: saturated,
        };
        // Down-sampled: each pair of points is one group's min and max (plotdata.py),
        // joined when the group's quanta are contiguous (it spans f quanta); a group
        // that spans missing quanta breaks between its two points.
        if (doc.downsampled > 1 && i % 2 === 1 &&
            s.end[i] - s.start[i - 1] <= doc.downsampled * doc.quantum_ms) r.joined = true;
        if (s.lo && s.hi) {
          var ci = {};
          keys.forEach(function (k) { ci[k] = [s.lo[k][i], s.hi[k][i]]; });
          r.percentiles_ci_ns = ci;
        }
        if (s.surface) {
          // The percentile surface (plotdata.py): many percentiles from the histograms.
          var surf = {};
          Object.keys(s.surface).forEach(function (k) { surf[k] = s.surface[k][i]; });
          r.surface = surf;
        }
        if (s.scope === "cluster") {
          r.min_ns = s.min_ns[i]; r.mean_ns = s.mean_ns[i]; r.max_ns = s.max_ns[i];
          r.iops = s.iops[i]; r.bytes_per_second = s.bytes_per_second[i];
          r.heat = s.heat[i];
        }
        rows.push(r);
      }
    });
    return rows;
  }

  /* Rows grouped for drawing: cluster rows per direction, host rows per direction. */
  function model(rows) {
    var cluster = {}, hosts = {}, ends = new Set();
    rows.forEach(function (r) {
      ends.add(r.end_ms);
      if (r.scope === "cluster") {
        (cluster[r.direction] = cluster[r.direction] || []).push(r);
      } else {
        var byHost = (hosts[r.direction] = hosts[r.direction] || {});
        (byHost[r.host] = byHost[r.host] || []).push(r);
      }
    });
    var byEnd = function (a, b) { return a.end_ms - b.end_ms; };
    Object.keys(cluster).forEach(function (d) { cluster[d].sort(byEnd); });
    Object.keys(hosts).forEach(function (d) {
      Object.keys(hosts[d]).forEach(function (h) { hosts[d][h].sort(byEnd); });
    });
    return {
      cluster: cluster, hosts: hosts,
      directions: DIRS.filter(function (d) { return cluster[d]; }),
      ends: Array.from(ends).sort(function (a, b) { return a - b; }),
    };
  }

  /* Whether quanta are missing between two neighbouring rows of one series: the line,
     the band and the IOPS break there (an idle period is drawn as nothing, never as a
     straight line between the quanta around it). */
  function gapBetween(prev, r) {
    return !r.joined && r.start_ms > prev.end_ms;
  }

  /* The points of one series: {ms, r} per row at its end; where quanta are missing, a
     break ({ms, r: null}) and the next row also at its start, so a quantum after a gap
     is drawn as a flat segment over its own span, not as an invisible lone point. */
  function points(rows) {
    var out = [];
    rows.forEach(function (r, i) {
      if (i > 0 && gapBetween(rows[i - 1], r)) {
        out.push({ ms: (rows[i - 1].end_ms + r.start_ms) / 2, r: null });
        out.push({ ms: r.start_ms, r: r });
      }
      out.push({ ms: r.end_ms, r: r });
    });
    return out;
  }

  /* Time columns of a heatmap: one per row, and one empty column (labelled with the
     time missing) where quanta are missing, so an idle period is not hidden. */
  function columns(self, rows) {
    var out = [];
    rows.forEach(function (r, i) {
      if (i > 0 && gapBetween(rows[i - 1], r)) {
        out.push({ label: "no data " + ((r.start_ms - rows[i - 1].end_ms) / 1000).toFixed(0) + " s", r: null });
      }
      out.push({ label: self.timeLabel(r.end_ms), r: r });
    });
    return out;
  }

  /* A latency in ns as "5 ms", "250 µs" (3 significant digits, no trailing zeros). */
  function fmtShort(ns) {
    var units = [[1e9, " s"], [1e6, " ms"], [1e3, " µs"], [1, " ns"]];
    for (var i = 0; i < units.length; i++) {
      if (ns >= units[i][0] || i === units.length - 1) return Number((ns / units[i][0]).toPrecision(3)) + units[i][1];
    }
    return String(ns);
  }

  function Renderer(doc, meta) {
    this.doc = doc;
    // {percentiles, sla: [{direction (null: every chart), threshold_ns, label}],
    //  colours: {sla, mean, saturated, percentiles: {key: colour}}, relative}
    this.meta = meta;
    this.colours = meta.colours || COLOURS;
    this.charts = {};
    this.container = doc.getElementById("charts");
    this.direction = null;
    this.pctIndex = Math.max(0, meta.percentiles.indexOf("99"));
    var self = this;
    this.dirSelect = doc.getElementById("direction");
    this.dirSelect.addEventListener("change", function () {
      self.direction = self.dirSelect.value;
      self.draw(self.rows);
    });
    this.pctInput = doc.getElementById("pct");
    this.pctInput.max = String(Math.max(0, meta.percentiles.length - 1));
    this.pctInput.value = String(this.pctIndex);
    this.pctInput.addEventListener("input", function () {
      self.pctIndex = Number(self.pctInput.value);
      self.draw(self.rows);
    });
    global.addEventListener("resize", function () { self.resizeAll(); });
    global.fiomonRenderer = this;
  }

  Renderer.prototype.x = function (ms) {
    return this.meta.relative ? ms / 1000 : ms;
  };

  Renderer.prototype.chart = function (id, title, tall) {
    if (this.charts[id]) return this.charts[id];
    var h = this.doc.createElement("h2");
    h.textContent = title;
    h.id = "title-" + id;
    var el = this.doc.createElement("div");
    el.className = "chart" + (tall ? " tall" : "");
    el.id = "chart-" + id;
    this.container.appendChild(h);
    this.container.appendChild(el);
    var c = global.echarts.init(el, null, { renderer: "canvas" });
    this.charts[id] = c;
    return c;
  };

  Renderer.prototype.timeAxis = function () {
    var rel = this.meta.relative;
    return {
      type: rel ? "value" : "time", name: rel ? "s since start" : "",
      scale: true, axisLabel: { hideOverlap: true },
    };
  };

  Renderer.prototype.zoom = function () {
    return [{ type: "inside", xAxisIndex: 0 }, { type: "slider", xAxisIndex: 0, height: 18, bottom: 4 }];
  };

  Renderer.prototype.timeLabel = function (ms) {
    if (this.meta.relative) return (ms / 1000).toFixed(1) + " s";
    return new Date(ms).toISOString().slice(11, 19);
  };

  /* A positive latency in ms, or null (a log axis cannot place 0; null: unbounded). */
  function posMs(ns) {
    return ns === null || ns === undefined || !(ns > 0) ? null : ns / 1e6;
  }

  /* The confidence band of percentile `k`: points [x, low ms, high ms] (null: a side the
     data cannot bound), drawn as one translucent quad per pair of neighbouring points
     where all four corners are known. A quantum with an unbounded side leaves a gap:
     the band never pretends to a bound the data does not give. All bands share one
     legend entry, which toggles them together. */
  function bandSeries(self, k, pts, color) {
    var data = pts.map(function (p) {
      var ci = (p.r && p.r.percentiles_ci_ns || {})[k] || [null, null];
      return [self.x(p.ms), posMs(ci[0]), posMs(ci[1])];
    });
    return {
      id: "band-" + k, name: BANDS, type: "custom", data: data, z: 1, silent: true,
      clip: true, tooltip: { show: false }, itemStyle: { color: color },
      encode: { x: 0, y: [1, 2] },
      renderItem: function (params, api) {
        var i = params.dataIndex;
        var a = data[i], b = data[i + 1];
        if (!b || a[1] === null || a[2] === null || b[1] === null || b[2] === null) return null;
        return {
          type: "polygon",
          shape: { points: [api.coord([a[0], a[1]]), api.coord([b[0], b[1]]),
            api.coord([b[0], b[2]]), api.coord([a[0], a[2]])] },
          style: { fill: color, opacity: 0.18 },
        };
      },
    };
  }

  /* " · run a, b" for the run labels of `rows` (closed quanta's `runs`) and `extra`
     (the offline document's), at most three named. */
  function runsText(rows, extra) {
    var seen = new Set(extra || []);
    rows.forEach(function (r) { (r.runs || []).forEach(function (x) { seen.add(x); }); });
    var names = Array.from(seen).sort();
    if (!names.length) return "";
    return " · run" + (names.length > 1 ? "s " : " ") + names.slice(0, 3).join(", ") +
      (names.length > 3 ? " and " + (names.length - 3) + " more" : "");
  }

  /* Percentile lines with their confidence bands and the mean of one direction, log
     latency axis, SLA lines. */
  Renderer.prototype.colour = function (k) {
    return (this.colours.percentiles || {})[k] || "#888888";
  };

  /* The SLA rules drawn on direction `d`'s chart: its own direction's only. */
  Renderer.prototype.slaFor = function (d) {
    return (this.meta.sla || []).filter(function (s) { return !s.direction || s.direction === d; });
  };

  Renderer.prototype.latency = function (d, rows) {
    var self = this;
    var keys = this.meta.percentiles;
    var pts = points(rows);
    var ms = function (v) { return v === null || v === undefined ? null : v / 1e6; };
    var series = keys.map(function (k) {
      var colour = self.colour(k);
      return {
        name: "p" + k, type: "line", showSymbol: false, sampling: "none", connectNulls: false,
        color: colour, itemStyle: { color: colour }, lineStyle: { color: colour, width: 2 },
        data: pts.map(function (p) { return [self.x(p.ms), p.r ? ms(p.r.percentiles_ns[k]) : null]; }),
      };
    });
    var withBands = rows.some(function (r) { return r.percentiles_ci_ns; });
    var bands = withBands ? keys.map(function (k) {
      return bandSeries(self, k, pts, self.colour(k));
    }) : [];
    series.push({
      name: "mean", type: "line", showSymbol: false, connectNulls: false,
      lineStyle: { type: "dashed", width: 1.5, color: this.colours.mean },
      color: this.colours.mean, itemStyle: { color: this.colours.mean },
      data: pts.map(function (p) { return [self.x(p.ms), p.r ? ms(p.r.mean_ns) : null]; }),
    });
    var sat = [];
    rows.forEach(function (r) {
      (r.saturated || []).forEach(function (k) {
        sat.push({ value: [self.x(r.end_ms), r.percentiles_ns[k] / 1e6], name: "p" + k });
      });
    });
    series.push({
      name: "saturated (lower bound)", type: "scatter", symbol: "triangle", symbolSize: 10,
      itemStyle: { color: this.colours.saturated }, data: sat,
    });
    // Quanta that lack a host or cell that was expected (complete: false): a hollow
    // point on the highest percentile, named by what is missing.
    var top = keys[keys.length - 1];
    series.push({
      name: "incomplete quantum", type: "scatter", symbol: "emptyCircle", symbolSize: 11,
      itemStyle: { color: "#b36b00" },
      data: rows.filter(function (r) { return r.complete === false; }).map(function (r) {
        var v = r.percentiles_ns[top];
        return { value: [self.x(r.end_ms), v === null || v === undefined ? null : v / 1e6],
                 name: missingText(r) };
      }),
    });
    // SLA thresholds of this direction's rules: black, dashed, labelled, on a series of
    // their own (its legend entry hides them); the axis reaches up to them.
    var sla = this.slaFor(d);
    var slaTop = 0;
    if (sla.length) {
      series.push({
        name: "SLA", type: "line", data: [], color: this.colours.sla,
        markLine: {
          symbol: "none", silent: true, animation: false,
          lineStyle: { color: this.colours.sla, type: "dashed", width: 1.5 },
          label: { position: "insideEndTop", color: this.colours.sla },
          data: sla.map(function (s) {
            slaTop = Math.max(slaTop, s.threshold_ns / 1e6);
            return { yAxis: s.threshold_ns / 1e6, name: s.label, label: { formatter: s.label } };
          }),
        },
      });
    }
    series = series.concat(bands);
    var c = this.chart("lat-" + d, "latency over time: " + d + " (cluster)");
    // an aggregator of lat or slat says so (clat, fio's usual, goes unsaid)
    var kind = this.meta.latency && this.meta.latency !== "clat" ? " · " + this.meta.latency : "";
    this.setTitle("lat-" + d, "latency over time: " + d + " (cluster)" + kind + runsText(rows, this.meta.runs));
    c.group = GROUP;
    c.setOption({
      animation: false,
      tooltip: {
        trigger: "axis",
        valueFormatter: function (v) { return v === null || v === undefined ? "-" : fmtNs(v * 1e6); },
      },
      legend: { top: 0 },
      grid: { left: 64, right: 40, top: 36, bottom: 50 },
      xAxis: this.timeAxis(),
      yAxis: {
        type: "log", name: "latency (ms)", logBase: 10, axisLabel: { formatter: "{value}" },
        // Up to the next power of ten above the data and the SLA lines (a log axis' own
        // top, which a plain maximum would print as 17.825792).
        max: slaTop ? function (v) {
          return Math.pow(10, Math.ceil(Math.log10(Math.max(v.max, slaTop * 1.5))));
        } : null,
      },
      dataZoom: this.zoom(),
      toolbox: { feature: { dataZoom: { yAxisIndex: "none" }, restore: {}, saveAsImage: {} } },
      series: series,
    }, { replaceMerge: ["series"] });
  };

  /* IOPS (left axis) and MB/s (right axis) of every direction on one time axis. */
  Renderer.prototype.throughput = function (m) {
    var self = this;
    var series = [];
    // Missing quanta break the lines (a quantum with no I/O is a row with 0 IOPS).
    m.directions.forEach(function (d) {
      var pts = points(m.cluster[d]);
      var val = function (v) { return v === null || v === undefined ? null : v; };
      series.push({
        name: "IOPS " + d, type: "line", showSymbol: false, yAxisIndex: 0, connectNulls: false,
        data: pts.map(function (p) { return [self.x(p.ms), p.r ? val(p.r.iops) : null]; }),
      });
      series.push({
        name: "MB/s " + d, type: "line", showSymbol: false, yAxisIndex: 1, connectNulls: false,
        lineStyle: { type: "dotted" },
        data: pts.map(function (p) {
          var b = p.r ? val(p.r.bytes_per_second) : null;
          return [self.x(p.ms), b === null ? null : b / 1e6];
        }),
      });
    });
    var c = this.chart("throughput", "IOPS and throughput (cluster)");
    c.group = GROUP;
    c.setOption({
      animation: false,
      tooltip: { trigger: "axis" },
      legend: { top: 0, type: "scroll" },
      grid: { left: 64, right: 64, top: 36, bottom: 50 },
      xAxis: this.timeAxis(),
      yAxis: [{ type: "value", name: "IOPS" }, { type: "value", name: "MB/s" }],
      dataZoom: this.zoom(),
      series: series,
    }, { replaceMerge: ["series"] });
  };

  function heatOption(self, xs, ys, data, name, yname, fmt) {
    var vals = data.map(function (p) { return p[2]; });
    var lo = vals.length ? Math.min.apply(null, vals) : 0;
    var hi = vals.length ? Math.max.apply(null, vals) : 1;
    return {
      animation: false,
      tooltip: {
        formatter: function (p) {
          return xs[p.value[0]] + "<br>" + ys[p.value[1]] + ": " + fmt(p.value[2]);
        },
      },
      grid: { left: 90, right: 130, top: 10, bottom: 50 },
      xAxis: { type: "category", data: xs, axisLabel: { hideOverlap: true } },
      // At most about 16 labels: a category axis would print every row's.
      yAxis: { type: "category", data: ys, name: yname, axisLabel: { interval: Math.max(0, Math.ceil(ys.length / 16) - 1) } },
      visualMap: {
        min: lo, max: hi === lo ? lo + 1 : hi, calculable: true, orient: "vertical",
        right: 0, top: "center", itemHeight: 160,
        formatter: function (v) { return fmt(v); },
        // Sequential (viridis, as the PNG/SVG figure): more is brighter, no muddy middle.
        inRange: { color: VIRIDIS },
      },
      dataZoom: [{ type: "inside", xAxisIndex: 0 }, { type: "slider", xAxisIndex: 0, height: 18, bottom: 4 }],
      // Drawn in one pass: progressive rendering would leave a screenshot (or a reader)
      // with a half-drawn map.
      series: [{ name: name, type: "heatmap", data: data, progressive: 0, progressiveThreshold: 1e9 }],
    };
  }

  /* Time x latency bucket, colour = log10(I/Os in the bucket) for one direction. */
  Renderer.prototype.heat = function (d, rows) {
    var self = this;
    var k0 = Infinity, k1 = -Infinity;
    rows.forEach(function (r) {
      if (r.heat) { k0 = Math.min(k0, r.heat.k0); k1 = Math.max(k1, r.heat.k0 + r.heat.counts.length - 1); }
    });
    if (!isFinite(k0)) return;
    var ys = [];
    for (var k = k0; k <= k1; k++) ys.push("≥ " + fmtNs(bucketEdgeNs(k)));
    var cols = columns(self, rows);
    var xs = cols.map(function (c) { return c.label; }), data = [];
    cols.forEach(function (c, i) {
      var r = c.r;
      if (!r || !r.heat) return;
      r.heat.counts.forEach(function (n, j) {
        if (n > 0) data.push([i, r.heat.k0 + j - k0, Math.log10(n)]);
      });
    });
    var c = this.chart("heat", "latency distribution over time (I/Os per latency band, log colour)", true);
    c.setOption(heatOption(self, xs, ys, data, "I/Os " + d, "latency",
      function (v) { return Math.pow(10, v).toPrecision(3) + " I/Os"; }), { notMerge: true });
    this.setTitle("heat", "latency distribution over time: " + d + " (I/Os per latency band, log colour)");
  };

  /* Time x percentile: the latency of every configured percentile, log colour. */
  Renderer.prototype.surface = function (d, rows) {
    var self = this;
    // The page's surface percentiles (p50..p99.99, evenly spread in nines) where the rows
    // carry them, else the rows' own percentiles.
    var fine = (this.meta.surface_percentiles || []).length &&
      rows.some(function (r) { return r.surface; });
    var keys = fine ? this.meta.surface_percentiles : this.meta.percentiles;
    var valueOf = function (r, k) { return fine ? (r.surface || {})[k] : r.percentiles_ns[k]; };
    var cols = columns(self, rows);
    var xs = cols.map(function (c) { return c.label; });
    var ys = keys.map(function (k) { return "p" + k; });
    var data = [];
    cols.forEach(function (c, i) {
      var r = c.r;
      if (!r) return;
      keys.forEach(function (k, j) {
        var v = valueOf(r, k);
        if (v > 0) data.push([i, j, Math.log10(v / 1e6)]);
      });
    });
    var c = this.chart("surface", "time x percentile");
    c.setOption(heatOption(self, xs, ys, data, "latency " + d, "percentile",
      function (v) { return fmtNs(Math.pow(10, v) * 1e6); }), { notMerge: true });
    this.setTitle("surface", "time x percentile: " + d + " (latency, log colour)");
  };

  /* Host x time heatmap of the chosen percentile: one slow host stands out. */
  Renderer.prototype.hostHeat = function (d, byHost, ends) {
    var self = this;
    var key = this.meta.percentiles[this.pctIndex];
    var hosts = Object.keys(byHost).sort();
    var col = new Map();
    var xs = [];
    var q = this.meta.quantum_ms;
    ends.forEach(function (e, i) {
      // Quanta missing between two ends: one empty column says so.
      if (q && i > 0 && e - ends[i - 1] > q) xs.push("no data " + ((e - ends[i - 1] - q) / 1000).toFixed(0) + " s");
      col.set(e, xs.length);
      xs.push(self.timeLabel(e));
    });
    var data = [];
    hosts.forEach(function (h, j) {
      byHost[h].forEach(function (r) {
        var v = r.percentiles_ns[key];
        if (v > 0 && col.has(r.end_ms)) data.push([col.get(r.end_ms), j, Math.log10(v / 1e6)]);
      });
    });
    var c = this.chart("hosts", "hosts", hosts.length > 12);
    c.setOption(heatOption(self, xs, hosts, data, "p" + key + " " + d, "host",
      function (v) { return fmtNs(Math.pow(10, v) * 1e6); }), { notMerge: true });
    this.setTitle("hosts", "p" + key + " per host over time: " + d + " (log colour)");
  };

  Renderer.prototype.setTitle = function (id, text) {
    var h = this.doc.getElementById("title-" + id);
    if (h) h.textContent = text;
  };

  Renderer.prototype.draw = function (rows) {
    this.rows = rows;
    var m = model(rows);
    var self = this;
    if (!this.direction || m.directions.indexOf(this.direction) < 0) {
      this.direction = m.directions.indexOf("read") >= 0 ? "read" : m.directions[0];
    }
    var opts = m.directions.map(function (d) {
      return '<option value="' + d + '"' + (d === self.direction ? " selected" : "") + ">" + d + "</option>";
    }).join("");
    if (this.dirSelect.innerHTML !== opts) this.dirSelect.innerHTML = opts;
    this.doc.getElementById("pct-label").textContent = "p" + this.meta.percentiles[this.pctIndex];
    m.directions.forEach(function (d) { self.latency(d, m.cluster[d]); });
    if (m.directions.length) {
      this.throughput(m);
      var d = this.direction;
      this.heat(d, m.cluster[d]);
      this.surface(d, m.cluster[d]);
      if (m.hosts[d]) this.hostHeat(d, m.hosts[d], m.ends);
    }
    global.echarts.connect(GROUP);
    this.publish(m, rows.length);
    this.whenRendered();
  };

  /* Whether zrender has painted every element of a chart (ECharts 6.1 internals: each
     canvas layer keeps draw cursors; a cursor behind its end is still painting). */
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

  /* Fit every chart to its box again (a window resize) and redraw. */
  Renderer.prototype.resizeAll = function () {
    if (global.fiomonState) global.fiomonState.rendered = false;
    this.whenRendered();
  };

  /* `rendered` turns true once every chart finished drawing (large heatmaps take several
     frames); a screenshot or a reader waits for it. */
  Renderer.prototype.whenRendered = function () {
    var self = this;
    var ids = Object.keys(this.charts);
    var pending = ids.length;
    var draw = this.drawCount = (this.drawCount || 0) + 1;
    if (global.fiomonState) global.fiomonState.rendered = false;
    var done = function () {
      if (draw !== self.drawCount || global.fiomonState.rendered) return;
      // ECharts says "finished" when its model is drawn, but zrender paints large
      // heatmaps a slice per frame after that: wait for the last slice too.
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
      // A chart with nothing new to draw may not fire: a resize forces one pass.
      c.resize();
    });
    if (pending === 0) done();
  };

  /* What the charts hold, read back from them, for tests and for the curious. */
  Renderer.prototype.publish = function (m, nrows) {
    var charts = {};
    var self = this;
    Object.keys(this.charts).forEach(function (id) {
      var opt = self.charts[id].getOption();
      charts[id] = (opt.series || []).map(function (s) {
        var out = { name: s.name, type: s.type, points: (s.data || []).length };
        if (s.id && String(s.id).indexOf("band-") === 0) out.id = s.id;
        if (id.indexOf("lat-") === 0 || id === "throughput") out.data = s.data;
        if (s.markLine && s.markLine.data) {
          out.markLines = s.markLine.data.map(function (x) { return x.yAxis; });
          out.labels = s.markLine.data.map(function (x) { return x.name; });
        }
        return out;
      });
    });
    var state = {
      ready: true, rendered: false, rows: nrows, quanta: m.ends.length, directions: m.directions,
      direction: this.direction, hosts: Object.keys(m.hosts[this.direction] || {}).length,
      last_end_ms: m.ends.length ? m.ends[m.ends.length - 1] : null, charts: charts,
      draws: (global.fiomonState ? global.fiomonState.draws : 0) + 1,
    };
    global.fiomonState = state;
    this.doc.body.setAttribute("data-state", JSON.stringify(state));
  };

  /* The page config's colours (fiomon/palette.py), with the live meta's percentile
     colours (the aggregator's percentiles are known only to the API). */
  function coloursOf(cfg, meta) {
    var c = cfg.colours || COLOURS;
    var pct = Object.assign({}, c.percentiles || {}, (meta && meta.colours) || {});
    return { sla: c.sla, mean: c.mean, saturated: c.saturated, percentiles: pct };
  }

  function info(doc, text) { doc.getElementById("info").textContent = text; }

  /* Offline: draw the embedded document once. */
  function drawOffline(doc, data, cfg) {
    // `fiomon plot --sla [pPCT:][DIR:]LATENCY`: on its direction's chart (none: every
    // chart), labelled as plotdata.py says.
    var sla = data.sla ? data.sla.map(function (x) {
      return { direction: x.direction, threshold_ns: x.ns, label: x.label };
    }) : (data.sla_ns || []).map(function (ns) {
      return { direction: null, threshold_ns: ns, label: "SLA " + fmtShort(ns) };
    });
    var r = new Renderer(doc, {
      percentiles: data.percentiles, sla: sla, relative: data.relative,
      quantum_ms: data.downsampled > 1 ? null : data.quantum_ms,  // pairs of ends are groups
      surface_percentiles: data.surface_percentiles || [], runs: data.runs || [],
      colours: coloursOf(cfg, null),
    });
    var rows = unpack(data);
    var when = data.relative ? "times in s since job start"
      : "times UTC, " + new Date(data.t0).toISOString().slice(0, 10);
    info(doc, rows.length + " rows, quantum " + data.quantum_ms + " ms, " + when +
      (data.downsampled > 1 ? "; down-sampled: each pair of points is the min and max of " +
        data.downsampled + " quanta" : ""));
    r.draw(rows);
    return r;
  }

  /* What an incomplete row lacks: the root names the missing cells, the aggregator
     only knows that a host it expected sent nothing. */
  function missingText(r) {
    return r.cells_missing && r.cells_missing.length ? "missing " + r.cells_missing.join(", ")
      : "a host that was expected sent nothing";
  }

  function escapeHtml(text) {
    return String(text).replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }

  /* Incomplete quanta among the stored cluster rows, and the newest quantum's row if it
     is one. */
  function incompleteOf(store) {
    var ends = new Set(), last = null;
    store.forEach(function (r) {
      if (r.scope !== "cluster") return;
      if (r.complete === false) ends.add(r.end_ms);
      if (!last || r.end_ms > last.end_ms || (r.end_ms === last.end_ms && r.complete === false)) last = r;
    });
    return { count: ends.size, newest: last && last.complete === false ? last : null };
  }

  /* The host with the highest percentile `k` of `direction` in the newest quantum that
     has host rows: who a cluster rule's breach is about. */
  function worstHost(store, direction, k) {
    var newest = -Infinity, best = null;
    store.forEach(function (r) {
      if (r.scope === "host" && r.direction === direction && r.end_ms > newest) newest = r.end_ms;
    });
    store.forEach(function (r) {
      if (r.scope !== "host" || r.direction !== direction || r.end_ms !== newest) return;
      var v = r.percentiles_ns[k];
      if (v !== null && v !== undefined && (!best || v > best.v)) best = { host: r.host, v: v };
    });
    return best;
  }

  function statusHtml(st, meta, inc, store) {
    var parts = [];
    var silent = st.silent_hosts || [];
    parts.push("<span>hosts reporting: <b>" + st.hosts_up + "</b></span>");
    if (silent.length) {
      var more = (st.silent_count || silent.length) - silent.length;
      parts.push('<span class="pending" id="silent">silent: <b>' + escapeHtml(silent.join(", ")) +
        "</b>" + (more > 0 ? " and " + more + " more" : "") + "</span>");
    }
    parts.push("<span>late records: <b>" + st.late_records + "</b></span>");
    parts.push("<span>lost records: <b>" + st.lost_records + "</b></span>");
    if (inc) {
      parts.push("<span>incomplete quanta: <b>" + inc.count + "</b></span>");
      if (inc.newest) {
        var what = inc.newest.cells_missing && inc.newest.cells_missing.length ? missingText(inc.newest)
          : (silent.length ? silent.join(", ") + " sent nothing" : missingText(inc.newest));
        parts.push('<span class="pending" id="incomplete">incomplete: ' + escapeHtml(what) + "</span>");
      }
    }
    var scopes = {};
    (meta.sla || []).forEach(function (s) { scopes[s.rule] = s.scope; });
    (st.sla || []).forEach(function (s) {
      var cls = s.state === "firing" ? "firing" : (s.state === "pending" ? "pending" : "ok");
      var where = "";
      if (s.host) {
        where = " on " + escapeHtml(s.host) + (s.value_ns ? " (" + fmtNs(s.value_ns) + ")" : "");
      } else if (scopes[s.rule] === "host") {
        where = " (each host)";
      } else if (s.worst_hosts && s.worst_hosts.length) {
        // The aggregator's: whose I/Os hold the cluster's tail in the incident.
        where = "; worst hosts " + s.worst_hosts.slice(0, 3).map(function (hs) {
          return escapeHtml(hs[0]) + " (" + Math.round(hs[1] * 100) + " % of the tail)";
        }).join(", ");
      } else if (s.state === "firing" || s.state === "pending") {
        var w = worstHost(store, s.direction, s.percentile);
        if (w) where = "; worst host " + escapeHtml(w.host) + " (" + fmtNs(w.v) + ")";
      }
      parts.push('<span class="' + cls + '">SLA ' + escapeHtml(s.rule) + ": p" + s.percentile + " " +
        s.direction + " &lt; " + fmtNs(s.threshold_ns) + where +
        ": <b>" + s.state + "</b>" +
        (s.state === "resolved" && s.ended !== undefined ? (s.ended ? " (ended: the benchmark stopped)" : " (recovered)") : "") +
        (s.more ? " and " + s.more + " more hosts" : "") + "</span>");
    });
    parts.push("<span>window: " + Math.round(meta.window_s / 60) + " min (hosts: " +
      Math.round((meta.host_window_s || meta.window_s) / 60) + " min)</span>");
    return parts.join("");
  }

  /* Live: poll the aggregator's API, keep the last window of rows, redraw on news.
     A quantum revised after it closed (late records merged in) comes again, however old,
     when the answer's "revised" count passed the one we sent: its rows replace the
     stored ones key by key (a lower revision never replaces a higher one). */
  function runLive(doc, cfg) {
    var store = new Map();
    var since = 0;
    var revised = -1;  // none yet: the first answer holds every quantum anyway
    var r = null;
    var statusEl = doc.getElementById("status");
    function tick() {
      var url = cfg.api + "?since=" + since + (revised >= 0 ? "&revised=" + revised : "");
      global.fetch(url, { cache: "no-store" })
        .then(function (resp) { return resp.json(); })
        .then(function (body) {
          var meta = body.meta;
          if (!r) {
            r = new Renderer(doc, {
              percentiles: meta.percentiles, sla: meta.sla || [], relative: false,
              quantum_ms: meta.quantum_ms,
              colours: coloursOf(cfg, meta),
            });
          }
          var news = 0;
          // A count that went back: the server restarted (and forgot what it counted);
          // the next poll asks for everything again.
          var restarted = typeof body.revised === "number" && body.revised < revised;
          if (typeof body.revised === "number") revised = body.revised;
          body.quanta.forEach(function (row) {
            var k = row.scope + "|" + (row.host || "") + "|" + row.direction + "|" + row.end_ms;
            var old = store.get(k);
            if (old && (old.revision || 0) > (row.revision || 0)) return;
            // The same revision read back from the quanta file has no heat: keep the one seen.
            if (old && old.heat && !row.heat && (old.revision || 0) === (row.revision || 0)) row.heat = old.heat;
            store.set(k, row);
            since = Math.max(since, row.end_ms);
            news++;
          });
          // Cluster rows for the whole window, host rows for the last few minutes only
          // (the API serves no more: see fiomon/server/live.py).
          var cut = since - meta.window_s * 1000;
          var hostCut = since - (meta.host_window_s || meta.window_s) * 1000;
          store.forEach(function (row, k) {
            if (row.end_ms <= cut || (row.scope === "host" && row.end_ms <= hostCut)) store.delete(k);
          });
          statusEl.hidden = false;
          statusEl.innerHTML = statusHtml(body.status, meta, incompleteOf(store), store);
          info(doc, "live: " + store.size + " rows, last quantum ends " +
            (since ? new Date(since).toISOString().slice(11, 23) + " UTC" : "-") +
            ", quantum " + meta.quantum_ms + " ms");
          if (news || !global.fiomonState) r.draw(Array.from(store.values()));
          if (restarted) since = 0;
        })
        .catch(function (e) { info(doc, "live: cannot reach the aggregator (" + e + "), retrying"); })
        .then(function () { global.setTimeout(tick, cfg.poll_ms); });
    }
    tick();
  }

  function main(doc) {
    var cfg = JSON.parse(doc.getElementById("fiomon-config").textContent);
    if (cfg.live) {
      runLive(doc, cfg);
      return;
    }
    var data = JSON.parse(doc.getElementById("fiomon-data").textContent);
    drawOffline(doc, data, cfg);
  }

  global.fiomon = { main: main, unpack: unpack, model: model, Renderer: Renderer, bucketEdgeNs: bucketEdgeNs };
})(window);
