// onejob: a job page's live text (docs/browser.md, "Live text").
//
// A section marked `data-live-text="/jobs/{id}/stream"` follows that
// server-sent event stream: each `text` event's text is appended as a text
// node (never parsed as HTML: the answer is untrusted). On `end`, the job's
// live part is fetched once more so the page shows the final state; on
// `refused`, the section says why there is no live text. Without this
// script (or without JavaScript) the section stays hidden and the page
// reaches the answer by refreshing itself as before.
(function () {
  "use strict";

  function refreshJob(then) {
    var live = document.getElementById("job-live");
    var path = live && live.getAttribute("data-path");
    if (!live || !path || !window.htmx) {
      then();
      return;
    }
    window.htmx
      .ajax("GET", path, { target: live, swap: "outerHTML" })
      .then(then, then);
  }

  function follow(section) {
    if (section.getAttribute("data-live-state")) return;
    section.setAttribute("data-live-state", "following");
    var out = section.querySelector("[data-live-output]");
    var note = section.querySelector("[data-live-note]");
    var source = new EventSource(section.getAttribute("data-live-text"));
    // A boosted navigation away removes the section: stop following.
    var watch = window.setInterval(function () {
      if (!section.isConnected) stop("left");
    }, 1000);

    function stop(state) {
      source.close();
      window.clearInterval(watch);
      section.setAttribute("data-live-state", state);
    }

    function data(event) {
      try {
        return JSON.parse(event.data);
      } catch (e) {
        return {};
      }
    }

    source.addEventListener("text", function (event) {
      var text = data(event).text;
      if (typeof text !== "string") return;
      out.appendChild(document.createTextNode(text));
      section.hidden = false;
    });
    source.addEventListener("end", function (event) {
      var end = data(event);
      stop("ended");
      section.setAttribute("data-live-status", String(end.status || ""));
      if (end.status === "succeeded") {
        // The final answer replaces the live text once it is on the page.
        refreshJob(function () {
          section.remove();
        });
      } else {
        // What was seen stays, with why the stream stopped.
        if (end.message) {
          note.textContent = String(end.message);
          section.hidden = false;
        }
        refreshJob(function () {});
      }
    });
    // A refusal by status (the job is gone, the session ended) closes the
    // source for good; a dropped connection is retried by EventSource.
    source.addEventListener("error", function () {
      if (source.readyState === EventSource.CLOSED) stop("closed");
    });
    source.addEventListener("refused", function (event) {
      stop("refused");
      note.textContent = String(data(event).message || "");
      section.hidden = false;
    });
  }

  function scan(root) {
    var scope = root && root.querySelectorAll ? root : document;
    var sections = scope.querySelectorAll("[data-live-text]");
    for (var i = 0; i < sections.length; i++) follow(sections[i]);
    if (scope.matches && scope.matches("[data-live-text]")) follow(scope);
  }

  document.addEventListener("DOMContentLoaded", function () {
    scan(document);
  });
  // Pages reached by a boosted navigation arrive through htmx.
  document.addEventListener("htmx:load", function (event) {
    scan(event.target);
  });
})();
