// Live updates without a reload. A page whose <main> carries data-live="SECONDS" fetches
// itself every SECONDS and swaps in the fresh <main> (scroll position, sign-in and CSRF
// token stay as they are); it stops once the fresh page no longer asks for updates (a
// replay that is over). Without JavaScript, the page's <noscript> refresh reloads it.
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  if (!main) {
    return;
  }
  var every = Math.max(1, Number(main.getAttribute("data-live")) || 2) * 1000;
  var root = document.documentElement;
  root.setAttribute("data-live-updates", "0");

  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main");
    if (!fresh) {
      return true;
    }
    main.innerHTML = fresh.innerHTML;
    root.setAttribute("data-live-updates", String(Number(root.getAttribute("data-live-updates")) + 1));
    return fresh.hasAttribute("data-live");
  }

  function tick() {
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        var type = response.headers.get("content-type") || "";
        if (!response.ok || type.indexOf("text/html") !== 0) {
          return true; // signed out, or the console restarting: keep trying
        }
        return response.text().then(swap);
      })
      .catch(function () {
        return true; // the console unreachable for a moment: keep trying
      })
      .then(function (again) {
        if (again) {
          window.setTimeout(tick, every);
        } else {
          main.removeAttribute("data-live");
        }
      });
  }

  window.setTimeout(tick, every);
})();
