(function () {
  "use strict";
  var root = document.documentElement;
  var record = window.__kvxRecordError || function () {};
  function applyFilter() {
    var box = document.getElementById("test-filter");
    if (!box) { return; }
    var text = box.value.trim().toLowerCase();
    var shown = {};
    document.querySelectorAll("input[data-outcome]").forEach(function (cb) { shown[cb.getAttribute("data-outcome")] = cb.checked; });
    var visible = 0;
    document.querySelectorAll("#all-tests tbody tr").forEach(function (tr) {
      var ok = shown[tr.getAttribute("data-outcome")] !== false &&
        (!text || tr.getAttribute("data-search").indexOf(text) >= 0);
      tr.style.display = ok ? "" : "none";
      if (ok) { visible += 1; }
    });
    var n = document.getElementById("test-count");
    if (n) { n.textContent = String(visible); }
  }

  try {
    var box = document.getElementById("test-filter");
    if (box) { box.addEventListener("input", applyFilter); }
    document.querySelectorAll("input[data-outcome]").forEach(function (cb) { cb.addEventListener("change", applyFilter); });
    document.querySelectorAll("button.copy").forEach(function (btn) {
      btn.addEventListener("click", function () {
        var target = document.getElementById(btn.getAttribute("data-target"));
        var text = target ? target.textContent : "";
        var done = function () { btn.textContent = "copied"; setTimeout(function () { btn.textContent = "copy"; }, 1200); };
        if (navigator.clipboard && navigator.clipboard.writeText) {
          navigator.clipboard.writeText(text).then(done, function () { selectText(target); });
        } else { selectText(target); }
      });
    });
    applyFilter();
  } catch (e) { record(e && e.message || String(e)); }

  function selectText(el) {
    if (!el) { return; }
    var range = document.createRange();
    range.selectNodeContents(el);
    var sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
  }
  root.setAttribute("data-report-ready", "1");
})();
