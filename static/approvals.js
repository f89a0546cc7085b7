/* agentrun reviewer dashboard: the little the pages need beyond htmx. */
(function () {
  "use strict";

  var CARD = "#calls .call[data-tool-call-id]";

  window.approvals = {
    /* The open calls this page shows, for the thread page's live refresh (hx-vals). JSON: ids may hold
       any character, spaces included. */
    knownCallIds: function () {
      return JSON.stringify(Array.from(document.querySelectorAll("[data-tool-call-id]"))
        .map(function (el) { return el.dataset.toolCallId; }));
    },
  };

  /* The thread page's live refresh says which calls it shows (hx-vals="js:…" would need eval, which the
     Content-Security-Policy forbids). */
  document.addEventListener("htmx:configRequest", function (event) {
    if (event.detail.elt.id === "live-refresh") {
      event.detail.parameters.known = window.approvals.knownCallIds();
    }
  });

  /* --- the live feed: "live", or "offline — reconnecting" with deciding disabled until re-synced --- */
  // Reconnect soon after a drop (a reviewer should not wait a minute), backing off to 8 s.
  htmx.config.wsReconnectDelay = function (retryCount) {
    return Math.min(8000, 500 * Math.pow(2, retryCount)) * (0.5 + Math.random() / 2);
  };
  var everOpened = false;
  var offline = false;
  var retries = 0;

  function showState(state, text) {
    document.body.dataset.live = state;
    document.querySelectorAll(".live-badge").forEach(function (b) { b.textContent = text; });
    applyLiveState();
  }

  /* Stale cards must not be decided: every decide control is disabled while offline or re-syncing. */
  function applyLiveState() {
    var blocked = offline || document.body.dataset.live === "syncing";
    document.querySelectorAll(".call fieldset.decide, .batch fieldset.decide, .call .grant fieldset, .call .grant button")
      .forEach(function (el) { el.disabled = blocked; });
  }

  function resync() {
    // Re-fetch what this page shows: what happened while offline is on the server, not in this page.
    var target = document.getElementById("calls") ? "#calls" : document.getElementById("threads") ? "#threads" : null;
    if (!target) { showState("on", "live"); return; }
    showState("syncing", "reconnected — syncing…");
    var url = location.pathname + location.search;
    if (target === "#calls") {
      var threadUrl = document.querySelector(".thread-page").dataset.threadUrl; // "…/?id=.." for "." and ".."
      url = threadUrl + (threadUrl.indexOf("?") < 0 ? "?" : "&") + "resync=1&known=" +
        encodeURIComponent(window.approvals.knownCallIds());
    }
    htmx.ajax("GET", url, { target: target, swap: "outerHTML" }).then(function () {
      if (!offline) showState("on", "live");
    });
  }

  document.addEventListener("htmx:wsOpen", function () {
    retries = 0;
    offline = false;
    if (everOpened) resync(); else showState("on", "live");
    everOpened = true;
  });
  document.addEventListener("htmx:wsClose", function (event) {
    offline = true;
    showState("off", "offline — reconnecting");
    var code = event.detail.event.code;
    // The extension itself retries only 1006/1011/1012/1013; any other drop (a server going away
    // with 1001, a proxy's close) is retried here. 4403: the feed refused this user, for good.
    if ([1006, 1011, 1012, 1013, 4403].indexOf(code) < 0 && event.detail.socketWrapper) {
      var wrapper = event.detail.socketWrapper;
      setTimeout(function () { wrapper.reconnect(); }, htmx.config.wsReconnectDelay(retries++));
    }
  });
  // A card arriving while offline (a late response) stays disabled too.
  document.addEventListener("htmx:load", function (event) {
    applyLiveState();
    event.target.querySelectorAll && event.target.querySelectorAll(".decide-form.editing").forEach(syncEditor);
  });

  /* --- editing is a mode: Edit opens the editor; Approve is off while the editor differs --- */
  function canonical(value) {
    if (Array.isArray(value)) return "[" + value.map(canonical).join(",") + "]";
    if (value && typeof value === "object") {
      return "{" + Object.keys(value).sort().map(function (k) {
        return JSON.stringify(k) + ":" + canonical(value[k]);
      }).join(",") + "}";
    }
    return JSON.stringify(value);
  }
  function sameJson(a, b) {
    try { return canonical(JSON.parse(a)) === canonical(JSON.parse(b)); } catch (e) { return a === b; }
  }
  function syncEditor(form) {
    var box = form.querySelector("textarea[name=args]");
    var approve = form.querySelector("button[name=action][value=approve]");
    if (!box || !approve) return;
    var differs = !box.disabled && !sameJson(box.value, box.dataset.original);
    form.classList.toggle("differs", differs);
    approve.disabled = differs;
    approve.title = differs ? "Your edit differs from the arguments shown: use Edit & approve" : "";
  }
  function setEditing(form, on) {
    var box = form.querySelector("textarea[name=args]");
    form.classList.toggle("editing", on);
    form.querySelector(".editor").hidden = !on;
    form.querySelector("[data-edit=open]").hidden = on;
    box.disabled = !on; // a closed editor sends nothing
    if (on) { box.focus(); } else { box.value = box.dataset.original; }
    syncEditor(form);
  }
  document.addEventListener("click", function (event) {
    var toggle = event.target.closest("[data-edit]");
    if (toggle) setEditing(toggle.closest("form"), toggle.dataset.edit === "open");
    if (event.target.closest("[data-keys=open]")) showKeys();
  });
  document.addEventListener("input", function (event) {
    if (event.target.matches(".decide-form textarea[name=args]")) syncEditor(event.target.closest("form"));
  });

  /* --- keyboard: j/k move between cards, a/d approve/decline the focused one, e edits, ? shows keys --- */
  // After a decision swaps a card away, focus goes to the card now at its place.
  var refocus = null; // {card, index}

  function cards() { return Array.from(document.querySelectorAll(CARD)); }
  function focusedCard() { return document.activeElement && document.activeElement.closest(CARD); }
  function focusCard(card) {
    if (!card) return;
    card.focus();
    card.scrollIntoView({ block: "nearest" });
  }
  function move(step) {
    var all = cards();
    if (!all.length) return;
    var i = all.indexOf(focusedCard());
    focusCard(all[i < 0 ? 0 : Math.max(0, Math.min(all.length - 1, i + step))]);
  }
  function press(kind) {
    var card = focusedCard();
    if (!card) return;
    // Only the card's own action row: never a confirmation's "Yes, approve" (that takes a deliberate Tab).
    var button = card.querySelector(".actions button[name=action][value=" + kind + "]");
    if (!button || button.disabled || button.hidden) return;
    refocus = { card: card, index: cards().indexOf(card) };
    button.click(); // a high-risk approval answers with its confirmation step, nothing more
  }
  var beforeKeys = null;
  function showKeys() {
    var dialog = document.getElementById("keys-help");
    if (!dialog || dialog.open) return;
    beforeKeys = document.activeElement;
    dialog.addEventListener("close", function () {
      // Back to the card the reviewer had focused, so j/k go on from there. (The close event comes a
      // moment after the dialog hides: never take focus from where a key already moved it.)
      var card = beforeKeys && beforeKeys.closest && beforeKeys.closest(CARD);
      if (card && document.body.contains(card) && !focusedCard()) card.focus();
    }, { once: true });
    dialog.showModal();
  }
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented) return;
    // Typing is typing; an open dialog has its own keys.
    if (!event.target.closest || event.target.closest("input, textarea, select, [contenteditable], dialog[open]")) return;
    if (!document.getElementById("calls")) return;
    var handled = true;
    switch (event.key) {
      case "j": move(1); break;
      case "k": move(-1); break;
      case "a": press("approve"); break;
      case "d": press("decline"); break;
      case "e": {
        var card = focusedCard();
        var open = card && card.querySelector("[data-edit=open]");
        if (open && !open.hidden) open.click(); else handled = false;
        break;
      }
      case "?": showKeys(); break;
      default: handled = false;
    }
    if (handled) event.preventDefault();
  });
  document.addEventListener("htmx:afterSettle", function () {
    // Other swaps (the live feed's) may settle first: wait for the decided card to be gone.
    if (refocus === null || document.body.contains(refocus.card)) return;
    var i = refocus.index;
    refocus = null;
    if (document.activeElement && document.activeElement.closest(".call")) return; // e.g. a confirmation's autofocus
    var all = cards();
    if (all.length) focusCard(all[Math.min(i, all.length - 1)]);
  });

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
