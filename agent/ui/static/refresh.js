// Reload the page every data-refresh seconds while it is visible (0: never). The page's only
// script; served from /ui/static/ because the Content-Security-Policy allows no inline script.
(function () {
  var seconds = parseInt(document.body.getAttribute("data-refresh") || "0", 10);
  if (!(seconds > 0)) { return; }
  setInterval(function () {
    if (document.visibilityState === "visible" && !window.getSelection().toString()) {
      window.location.reload();
    }
  }, seconds * 1000);
})();
