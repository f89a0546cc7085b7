/* agentrun reviewer dashboard: the little the pages need beyond htmx. */
(function () {
  "use strict";

  window.approvals = {
    /* The open calls this page shows, for the thread page's live refresh (hx-vals). */
    knownCallIds: function () {
      return Array.from(document.querySelectorAll("[data-tool-call-id]"))
        .map(function (el) { return el.dataset.toolCallId; })
        .join(" ");
    },
  };

  /* Tell the user (and tests) whether the live feed is connected. */
  document.addEventListener("htmx:wsOpen", function () { document.body.dataset.live = "on"; });
  document.addEventListener("htmx:wsClose", function () { document.body.dataset.live = "off"; });

  /* Run page: stream the continuation from ws/runs/<id>/, then reload the page section once it ends. */
  function followRun() {
    var stateEl = document.getElementById("run-stream-state");
    if (!stateEl) return;
    var state = JSON.parse(stateEl.textContent);
    if (state.final) return;
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var url = scheme + location.host + "/ws/runs/" + encodeURIComponent(state.runId) + "/?after=" + state.after;
    var socket = new WebSocket(url);
    var received = false;
    var timer = null;
    function refresh() {
      clearTimeout(timer);
      timer = setTimeout(function () {
        htmx.ajax("GET", location.pathname, { target: "#run-body", swap: "outerHTML" });
      }, 100);
    }
    socket.addEventListener("message", function (event) {
      var chunk;
      try { chunk = JSON.parse(event.data); } catch (e) { return; }
      received = true;
      if (chunk.type === "text-delta") {
        var out = document.getElementById("live-output");
        if (out) out.textContent += chunk.payload.text; // textContent: model text stays inert
      } else if (chunk.type === "finish" || chunk.type === "tool-result" || chunk.type === "tool-output-denied") {
        refresh();
      }
    });
    socket.addEventListener("close", function () { if (received) refresh(); });
  }
  document.addEventListener("DOMContentLoaded", followRun);
})();
