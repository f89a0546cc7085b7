// The metrics page's charts (approvals/metrics.py): drawn with uPlot (static/vendor/uplot, MIT) from the
// page's own JSON (#metrics-data). The same numbers are in the page's tables and its CSV.
(function () {
  "use strict";
  // The window picker submits its form when changed.
  document.addEventListener("change", function (event) {
    if (event.target.matches("select[data-autosubmit]")) event.target.form.submit();
  });

  const KIND_COLOURS = { approve: "#137333", decline: "#b42318", resume: "#2456d6", expire: "#7a4b00" };

  function data() {
    const node = document.getElementById("metrics-data");
    return node ? JSON.parse(node.textContent) : null;
  }

  function days(d) {
    return d.days.map((day) => Date.parse(day + "T00:00:00Z") / 1000);
  }

  function width(el) {
    return Math.max(260, el.clientWidth);
  }

  function seconds(v) {
    if (v == null) return "–";
    for (const [unit, size] of [["d", 86400], ["h", 3600], ["min", 60]]) {
      if (v >= size) return +(v / size).toPrecision(3) + " " + unit;
    }
    return v + " s";
  }

  const charts = [];

  function draw() {
    const d = data();
    if (!d || typeof uPlot === "undefined") return;
    charts.splice(0).forEach((c) => c.destroy());
    const x = days(d);
    const decisions = document.getElementById("chart-decisions");
    const kinds = Object.keys(d.kinds);
    charts.push(new uPlot({
      width: width(decisions), height: 220, scales: { x: { time: true } },
      series: [{}].concat(kinds.map((k) => ({ label: k, stroke: KIND_COLOURS[k] || "#555", width: 2, points: { show: x.length < 40 } }))),
      axes: [{}, { label: "decisions" }],
    }, [x].concat(kinds.map((k) => d.kinds[k])), decisions));
    const waits = document.getElementById("chart-waits");
    charts.push(new uPlot({
      width: width(waits), height: 220, scales: { x: { time: true }, y: { distr: 3 } },
      series: [{}, { label: "p50", stroke: "#2456d6", width: 2, value: (u, v) => seconds(v) },
               { label: "p95", stroke: "#b42318", width: 2, value: (u, v) => seconds(v) }],
      axes: [{}, { values: (u, vals) => vals.map(seconds), size: 60 }],
    }, [x, d.p50, d.p95], waits));
  }

  let pending = null;
  window.addEventListener("resize", () => {
    clearTimeout(pending);
    pending = setTimeout(draw, 150);
  });
  document.addEventListener("DOMContentLoaded", draw);
})();
