// contend dashboard: refresh the numbers marked data-live and redraw the charts, once a second,
// from /api/live. No framework, no build step; pages work without it (they just stay still).
// <html data-root> is the path prefix the dashboard is served under ("" or like "/contend").
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var every = 1000;
  var root = document.documentElement.getAttribute("data-root") || "";

  function draw(svg, points, key) {
    var values = points.map(function (p) { return p[key]; });
    var w = 600, h = 160, pad = 24;
    var max = key === "success_rate" ? 1 : Math.max(1, Math.max.apply(null, values.filter(isFinite).concat([0])));
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var axis = document.createElementNS(SVG, "text");
    axis.setAttribute("x", 2); axis.setAttribute("y", 12); axis.setAttribute("class", "axis");
    axis.textContent = key === "success_rate" ? "100%" : max.toFixed(1) + "/s";
    svg.appendChild(axis);
    if (values.length < 2) return;
    var d = "", pen = "M";
    values.forEach(function (v, i) {
      if (v === null || !isFinite(v)) { pen = "M"; return; }
      var x = pad + (w - pad) * i / (values.length - 1);
      var y = h - 4 - (h - 20) * Math.min(v, max) / max;
      d += pen + x.toFixed(1) + " " + y.toFixed(1) + " ";
      pen = "L";
    });
    var path = document.createElementNS(SVG, "path");
    path.setAttribute("d", d); path.setAttribute("class", "line");
    svg.appendChild(path);
    var last = values[values.length - 1];
    svg.setAttribute("data-last", last === null ? "" : String(last));
  }

  function refresh() {
    fetch(root + "/api/live", { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) return;
        document.querySelectorAll("[data-live]").forEach(function (el) {
          var v = data.numbers[el.getAttribute("data-live")];
          if (v !== undefined && String(v) !== el.textContent) el.textContent = v;
        });
        document.querySelectorAll("svg[data-series]").forEach(function (svg) {
          draw(svg, data.points, svg.getAttribute("data-series"));
        });
        document.body.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () {})
      .then(function () { setTimeout(refresh, every); });
  }

  if (document.querySelector("[data-live], svg[data-series]")) refresh();
})();
