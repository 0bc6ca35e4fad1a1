// The warden dashboard's one script: keeps the page's live sections current and sends its
// forms without leaving the page. Served by the API itself; no library, no build step.
//
// It listens to /ui/events (the page, rendered again on a change of apps, instances or
// nodes in the store, differs) and fetches the page again, replacing each element marked
// data-live that changed by the one of the same id in the fresh page, and never a form the
// person is filling in. A form marked data-fetch is posted with fetch, and the answer (the page it
// redirects to, or a refusal) is swapped in the same way. Nothing here builds markup: the
// server renders (and escapes) every piece; the parsed page runs no script.
(function () {
  "use strict";
  var busy = false;
  var again = false;

  // Whether the person is filling `form` in: a field of it has the focus, or holds a value
  // other than the one the page came with.
  function inUse(form) {
    var active = document.activeElement;
    if (active && active !== document.body && form.contains(active)) {
      return true;
    }
    return Array.prototype.some.call(form.elements, function (f) {
      if (f.type === "hidden" || f.type === "submit" || f.type === "button") {
        return false;
      }
      if (f.type === "checkbox" || f.type === "radio") {
        return f.checked !== f.defaultChecked;
      }
      if (f.tagName === "SELECT") {
        return Array.prototype.some.call(f.options, function (o) {
          return o.selected !== o.defaultSelected;
        });
      }
      return f.value !== f.defaultValue;
    });
  }

  // Replaces `el` by `next` (from the fresh page). A live element holding a form being filled
  // in is never replaced whole (the typing would be lost): only its parts with an id that hold
  // no such form are.
  function replace(el, next) {
    if (el.isEqualNode(next)) {
      return;
    }
    var busyForm = Array.prototype.some.call(el.querySelectorAll("form"), inUse);
    if (!busyForm) {
      el.replaceWith(document.importNode(next, true));
      return;
    }
    Array.prototype.forEach.call(next.children, function (part) {
      var mine = part.id && document.getElementById(part.id);
      if (!mine || !el.contains(mine) || mine.isEqualNode(part)) {
        return;
      }
      var filling = mine.tagName === "FORM" ? [mine] : mine.querySelectorAll("form");
      if (!Array.prototype.some.call(filling, inUse)) {
        mine.replaceWith(document.importNode(part, true));
      }
    });
  }

  function swap(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html");
    document.querySelectorAll("[data-live][id]").forEach(function (el) {
      var next = fresh.getElementById(el.id);
      if (next) {
        replace(el, next);
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

  // A page with nothing live (a confirmation) listens to nothing. A page may name its own
  // stream (an app's, which also says when its release output grows).
  if (window.EventSource && document.querySelector("[data-live]")) {
    var named = document.querySelector("[data-events]");
    var url = named ? named.getAttribute("data-events") : "/ui/events";
    // The stream renders this page on each change and speaks only when it changed.
    url += (url.indexOf("?") < 0 ? "?" : "&") + "page=" + encodeURIComponent(window.location.pathname);
    var events = new EventSource(url);
    events.addEventListener("change", refresh);
    // A change between the page's render and the stream's start is not missed.
    events.addEventListener("open", refresh);
  }

  // Listened for on the document: a live section brings fresh copies of its forms.
  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!form.matches || !form.matches("form[data-fetch]")) {
      return;
    }
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
          form.reset();
          swap(html);
        }
      })
      .catch(function () {
        form.submit();
      });
  });
})();
