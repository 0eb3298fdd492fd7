(function () {
  "use strict";
  var root = document.documentElement;
  var errors = [];
  root.setAttribute("data-js-errors", "0");
  window.__kvxRecordError = function (msg) {
    errors.push(String(msg));
    root.setAttribute("data-js-errors", String(errors.length));
    root.setAttribute("data-js-error-text", errors.join(" | ").slice(0, 2000));
  };
  window.addEventListener("error", function (e) { window.__kvxRecordError(e.message || e.type); });
  window.addEventListener("unhandledrejection", function (e) {
    window.__kvxRecordError("unhandled rejection: " + ((e.reason && e.reason.message) || e.reason));
  });
})();
