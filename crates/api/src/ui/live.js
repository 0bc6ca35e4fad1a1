// The warden dashboard's one script: keeps the page's live sections current and sends its
// forms without leaving the page. Served by the API itself; no library, no build step.
//
// It listens to /ui/events (a change of apps, instances or nodes in the store) and fetches
// the page again, replacing each element marked data-live by the one of the same id in the
// fresh page. A form marked data-fetch is posted with fetch, and the answer (the page it
// redirects to, or a refusal) is swapped in the same way. Nothing here builds markup: the
// server renders (and escapes) every piece; the parsed page runs no script.
(function () {
  "use strict";
  var busy = false;
  var again = false;

  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    document.querySelectorAll("[data-live][id]").forEach(function (el) {
      var next = fresh.getElementById(el.id);
      if (next) {
        el.replaceWith(document.importNode(next, true));
      }
    });
  }

  function signedOut(r) {
    if (r.url && new URL(r.url).pathname === "/ui/login") {
      window.location.assign("/ui/login");
      return true;
    }
    return false;
  }

  function refresh() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    fetch(window.location.pathname + window.location.search, { credentials: "same-origin" })
      .then(function (r) {
        return signedOut(r) ? "" : r.text();
      })
      .then(function (html) {
        if (html) {
          swap(html);
        }
      })
      .catch(function () {})
      .finally(function () {
        busy = false;
        if (again) {
          again = false;
          refresh();
        }
      });
  }

  if (window.EventSource) {
    // A page whose live part follows something else names its stream (the audit page).
    var own = document.querySelector("[data-events]");
    var events = new EventSource(own ? own.getAttribute("data-events") : "/ui/events");
    events.addEventListener("change", refresh);
    // A change between the page's render and the stream's start is not missed.
    events.addEventListener("open", refresh);
  }

  document.querySelectorAll("form[data-fetch]").forEach(function (form) {
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      fetch(form.action, {
        method: "POST",
        credentials: "same-origin",
        body: new URLSearchParams(new FormData(form)),
      })
        .then(function (r) {
          return signedOut(r) ? "" : r.text();
        })
        .then(function (html) {
          if (html) {
            swap(html);
            form.reset();
          }
        })
        .catch(function () {
          form.submit();
        });
    });
  });
})();
