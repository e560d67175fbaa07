// Draws every chart of a page from its JSON spec (dashboard/charts.py) with uPlot, served from /static.
"use strict";
(function () {
  const pad = n => String(n).padStart(2, "0");
  const utc = s => {
    const d = new Date(s * 1000);
    return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}`;
  };
  const num = v => (v == null ? "—" : (Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : +v.toPrecision(6)).toString());
  const dots = (color, size, fill) => ({
    label: null, stroke: color, fill: fill, width: 0, paths: () => null,
    points: {show: true, size: size, stroke: color, fill: fill, width: 2},
  });

  function draw(box) {
    const source = document.getElementById(box.dataset.chart);
    if (!source || typeof uPlot === "undefined") return;
    const spec = JSON.parse(source.textContent);
    const time = spec.x === "time";
    const series = [
      {label: spec.xlabel, value: (u, v, si, i) => i == null ? "—" :
        (time ? utc(v) : "step " + num(v)) + " · " + spec.runs[i] + (time && spec.steps[i] != null ? " · step " + spec.steps[i] : "")},
      {label: spec.ylabel, stroke: "#1f5fa8", width: 2, value: (u, v) => num(v), spanGaps: true,
       points: {show: true, size: 4}},
      {label: "lower bound", stroke: "rgba(90,150,90,0.9)", width: 1, dash: [4, 3], value: (u, v) => num(v)},
      {label: "upper bound", stroke: "rgba(90,150,90,0.9)", width: 1, dash: [4, 3], value: (u, v) => num(v)},
    ];
    const data = [spec.xs, spec.value, spec.lower, spec.upper];
    const marks = [
      ["out", Object.assign(dots("#c0262d", 9, "#c0262d"), {label: "out of bounds", value: (u, v) => num(v)})],
      ["triaged", Object.assign(dots("#7a4fb0", 11, "rgba(255,255,255,0.9)"), {label: "triaged", value: (u, v) => num(v)})],
      ["current", Object.assign(dots("#111", 14, "rgba(255,200,0,0.8)"), {label: "this run", value: (u, v) => num(v)})],
    ];
    for (const [key, s] of marks) {
      if (spec[key].some(v => v != null)) { series.push(s); data.push(spec[key]); }
    }
    const width = () => Math.max(280, box.clientWidth);
    const opts = {
      width: width(), height: 300, series: series,
      bands: [{series: [3, 2], fill: "rgba(90,170,90,0.15)"}],
      scales: {x: {time: time}},
      tzDate: ts => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
      axes: [
        {label: spec.xlabel, space: 90},
        {label: spec.ylabel, size: 70, values: (u, vals) => vals.map(num)},
      ],
      cursor: {drag: {x: true, y: false}},
      legend: {live: true},
    };
    const plot = new uPlot(opts, data, box);
    box.uplot = plot;
    window.addEventListener("resize", () => plot.setSize({width: width(), height: 300}));
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-chart]").forEach(draw);
    document.body.dataset.chartsReady = "true";
  });
})();
