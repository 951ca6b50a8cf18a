// attnkit attention viewer: draws one layer/head of attention weights as a grid of cells and
// lists, for a hovered token, the tokens it attends to most. Everything it needs is inline in
// the page (the data is the JSON block "attnkit-data"); it makes no network request.
//
// State lives in the URL hash, e.g. #kind=encoder&layer=0&head=1&row=3, so a view can be
// bookmarked, and a headless browser can be pointed at one view. After every render the
// #viewer element carries a summary of what was drawn (data-cells, data-nonblank, data-sum,
// data-checksum, ...), which the tests read back.
(function () {
  "use strict";

  var DATA = JSON.parse(document.getElementById("attnkit-data").textContent);
  var BLUES = ["#f7fbff", "#deebf7", "#c6dbef", "#9dcae1", "#6aaed6",
               "#4191c6", "#2070b4", "#08509b", "#08306b"];  // matplotlib's "Blues"
  var TOP = 5;  // tokens listed on hover

  var el = {
    title: document.getElementById("title"),
    subtitle: document.getElementById("subtitle"),
    kind: document.getElementById("kind"),
    layer: document.getElementById("layer"),
    head: document.getElementById("head"),
    heatmap: document.getElementById("heatmap"),
    info: document.getElementById("info"),
    viewer: document.getElementById("viewer"),
    lo: document.getElementById("legend-lo"),
    hi: document.getElementById("legend-hi"),
    bar: document.getElementById("legend-bar")
  };
  var state = { kind: null, layer: 0, head: "0" };
  var view = null;  // what is drawn: {kind, matrix, rows, cols, cells: [[div]], rowLabels, colLabels}

  // ------------------------------------------------------------------ helpers

  function hex(n) { return (n < 16 ? "0" : "") + n.toString(16); }

  function colour(t) {  // t in [0, 1] -> a colour of BLUES, linearly interpolated
    t = Math.max(0, Math.min(1, t)) * (BLUES.length - 1);
    var i = Math.min(Math.floor(t), BLUES.length - 2), f = t - i;
    var a = BLUES[i], b = BLUES[i + 1], out = "#";
    for (var k = 1; k < 7; k += 2) {
      var x = parseInt(a.substr(k, 2), 16), y = parseInt(b.substr(k, 2), 16);
      out += hex(Math.round(x + (y - x) * f));
    }
    return out;
  }

  function fnv1a(hash, text) {  // 32-bit FNV-1a, continued from `hash`
    for (var i = 0; i < text.length; i++) {
      hash ^= text.charCodeAt(i);
      hash = Math.imul(hash, 16777619) >>> 0;
    }
    return hash;
  }

  function kindById(id) {
    for (var i = 0; i < DATA.kinds.length; i++) if (DATA.kinds[i].id === id) return DATA.kinds[i];
    return DATA.kinds[0];
  }

  function matrixOf(kind, layer, head) {  // (T_q, T_k) array for a head index or "mean"
    var heads = kind.layers[layer];
    if (head !== "mean") return heads[Number(head)];
    return heads[0].map(function (row, i) {
      return row.map(function (_, j) {
        var s = 0;
        for (var h = 0; h < heads.length; h++) s += heads[h][i][j];
        return s / heads.length;
      });
    });
  }

  function option(select, value, text) {
    var o = document.createElement("option");
    o.value = String(value);
    o.textContent = text;
    select.appendChild(o);
  }

  function div(cls, text) {
    var d = document.createElement("div");
    d.className = cls;
    if (text !== undefined) d.textContent = text;
    return d;
  }

  // ------------------------------------------------------------------ state <-> URL hash

  function readHash() {
    var params = {};
    location.hash.replace(/^#/, "").split("&").forEach(function (part) {
      var kv = part.split("=");
      if (kv[0]) params[decodeURIComponent(kv[0])] = decodeURIComponent(kv[1] || "");
    });
    return params;
  }

  function writeHash(extra) {
    var hash = "#kind=" + state.kind + "&layer=" + state.layer + "&head=" + state.head + (extra || "");
    try { history.replaceState(null, "", hash); } catch (e) { /* some file:// pages refuse */ }
  }

  function setState(params) {
    var kind = kindById(params.kind || state.kind || DATA.initial.kind);
    state.kind = kind.id;
    var layers = kind.layers.length, heads = kind.layers[0].length;
    var layer = parseInt(params.layer, 10);
    state.layer = isNaN(layer) ? Math.min(state.layer, layers - 1) : Math.max(0, Math.min(layer, layers - 1));
    var head = params.head === undefined ? state.head : params.head;
    state.head = head === "mean" ? "mean" : String(Math.max(0, Math.min(parseInt(head, 10) || 0, heads - 1)));
  }

  // ------------------------------------------------------------------ controls

  function fillControls() {
    var kind = kindById(state.kind);
    el.kind.textContent = "";
    DATA.kinds.forEach(function (k) { option(el.kind, k.id, k.label); });
    el.layer.textContent = "";
    for (var l = 0; l < kind.layers.length; l++) option(el.layer, l, String(l));
    el.head.textContent = "";
    for (var h = 0; h < kind.layers[0].length; h++) option(el.head, h, String(h));
    option(el.head, "mean", "mean of heads");
    el.kind.value = state.kind;
    el.layer.value = String(state.layer);
    el.head.value = state.head;
  }

  function onControl() {
    setState({ kind: el.kind.value, layer: el.layer.value, head: el.head.value });
    fillControls();
    render();
    writeHash();
  }

  // ------------------------------------------------------------------ drawing

  function render() {
    var kind = kindById(state.kind);
    var m = matrixOf(kind, state.layer, state.head);
    var rows = kind.rows, cols = kind.cols;
    var n = Math.max(rows.length, cols.length);
    var size = n <= 20 ? 26 : Math.max(12, Math.floor(520 / n));
    var vmax = 0, i, j;
    for (i = 0; i < m.length; i++) for (j = 0; j < m[i].length; j++) vmax = Math.max(vmax, m[i][j]);
    if (!(vmax > 0)) vmax = 1;

    var grid = el.heatmap;
    grid.textContent = "";
    grid.className = "";
    grid.style.setProperty("--cell", size + "px");
    grid.style.gridTemplateColumns = "max-content repeat(" + cols.length + ", " + size + "px)";
    grid.style.gridTemplateRows = "max-content repeat(" + rows.length + ", " + size + "px)";
    grid.appendChild(div("axis", kind.rowAxis + " \u2193  " + kind.colAxis + " \u2192"));

    var colLabels = cols.map(function (token, c) {
      var d = div("lab col", token);
      d.tabIndex = 0;
      d.dataset.c = c;
      grid.appendChild(d);
      return d;
    });
    var rowLabels = [], cells = [], nonblank = 0, sum = 0, checksum = 2166136261;
    for (i = 0; i < rows.length; i++) {
      var label = div("lab row", rows[i]);
      label.tabIndex = 0;
      label.dataset.r = i;
      grid.appendChild(label);
      rowLabels.push(label);
      var line = [];
      for (j = 0; j < cols.length; j++) {
        var v = m[i][j], fill = colour(v / vmax);
        var cell = div("cell");
        cell.style.background = fill;
        cell.dataset.r = i;
        cell.dataset.c = j;
        cell.dataset.v = v.toFixed(4);
        cell.title = rows[i] + " \u2192 " + cols[j] + ": " + v.toFixed(4);
        grid.appendChild(cell);
        line.push(cell);
        if (v > 0 && fill !== BLUES[0]) nonblank++;
        sum += v;
        checksum = fnv1a(checksum, fill + ";");
      }
      cells.push(line);
    }
    view = { kind: kind, matrix: m, rows: rows, cols: cols, cells: cells,
             rowLabels: rowLabels, colLabels: colLabels };

    el.lo.textContent = "0";
    el.hi.textContent = vmax.toFixed(2);
    el.bar.style.background = "linear-gradient(to right, " + BLUES.join(", ") + ")";

    var ds = el.viewer.dataset;  // the summary the tests read
    ds.kind = kind.id;
    ds.layer = String(state.layer);
    ds.head = state.head;
    ds.rows = String(rows.length);
    ds.cols = String(cols.length);
    ds.cells = String(rows.length * cols.length);
    ds.nonblank = String(nonblank);
    ds.sum = sum.toFixed(4);
    ds.checksum = String(checksum);
    ds.hover = "";
    clearInfo();
  }

  // ------------------------------------------------------------------ hover

  function clearFocus() {
    el.heatmap.classList.remove("focus");
    var on = el.heatmap.querySelectorAll(".on");
    for (var k = 0; k < on.length; k++) on[k].classList.remove("on");
  }

  function clearInfo() {
    el.info.innerHTML = "";
    var p = document.createElement("p");
    p.className = "hint";
    p.textContent = "Hover a token (or a cell) to see whom it attends to; " +
                    "hover a column token to see who attends to it.";
    el.info.appendChild(p);
  }

  function ranked(values, labels) {  // [{label, value}] highest first, at most TOP
    return values.map(function (v, k) { return { label: labels[k], value: v, index: k }; })
      .sort(function (a, b) { return b.value - a.value || a.index - b.index; })
      .slice(0, TOP);
  }

  function showList(heading, items) {
    el.info.textContent = "";
    var h = document.createElement("h2");
    h.textContent = heading;
    el.info.appendChild(h);
    var table = document.createElement("table");
    table.id = "top";
    var top = items.length ? items[0].value : 1;
    items.forEach(function (item) {
      var tr = document.createElement("tr");
      var name = document.createElement("td");
      name.textContent = item.label;
      var box = document.createElement("td");
      box.className = "barbox";
      var bar = div("bar");
      bar.style.width = Math.round(100 * item.value / (top || 1)) + "%";
      box.appendChild(bar);
      var v = document.createElement("td");
      v.className = "v";
      v.textContent = item.value.toFixed(3);
      tr.appendChild(name);
      tr.appendChild(box);
      tr.appendChild(v);
      table.appendChild(tr);
    });
    el.info.appendChild(table);
  }

  function focusRow(r) {
    if (!view || !(r >= 0 && r < view.rows.length)) return;
    clearFocus();
    el.heatmap.classList.add("focus");
    view.rowLabels[r].classList.add("on");
    view.cells[r].forEach(function (c) { c.classList.add("on"); });
    showList("\u201c" + view.rows[r] + "\u201d attends to", ranked(view.matrix[r], view.cols));
    el.viewer.dataset.hover = "row:" + r;
  }

  function focusCol(c) {
    if (!view || !(c >= 0 && c < view.cols.length)) return;
    clearFocus();
    el.heatmap.classList.add("focus");
    view.colLabels[c].classList.add("on");
    var column = view.matrix.map(function (row, i) { view.cells[i][c].classList.add("on"); return row[c]; });
    showList("\u201c" + view.cols[c] + "\u201d is attended by", ranked(column, view.rows));
    el.viewer.dataset.hover = "col:" + c;
  }

  function onPointer(event) {
    var t = event.target;
    if (!t || !t.dataset) return;
    if (t.dataset.r !== undefined) focusRow(Number(t.dataset.r));
    else if (t.dataset.c !== undefined) focusCol(Number(t.dataset.c));
  }

  // ------------------------------------------------------------------ start

  function start() {
    el.title.textContent = DATA.title;
    el.subtitle.textContent = DATA.subtitle || "";
    var params = readHash();
    state.kind = DATA.initial.kind;
    state.layer = DATA.initial.layer;
    state.head = String(DATA.initial.head);
    setState(params);
    fillControls();
    render();
    if (params.row !== undefined) focusRow(Number(params.row));
    else if (params.col !== undefined) focusCol(Number(params.col));
  }

  el.kind.addEventListener("change", onControl);
  el.layer.addEventListener("change", onControl);
  el.head.addEventListener("change", onControl);
  el.heatmap.addEventListener("mouseover", onPointer);
  el.heatmap.addEventListener("focusin", onPointer);
  el.heatmap.addEventListener("mouseleave", function () { clearFocus(); });
  window.addEventListener("hashchange", function () {
    setState(readHash());
    fillControls();
    render();
  });
  start();
})();
