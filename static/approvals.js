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
    document.querySelectorAll(".call fieldset.decide, .row-call fieldset.decide, .batch fieldset.decide, .call .grant fieldset, .call .grant button")
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
    event.target.querySelectorAll && event.target.querySelectorAll(".decide-form.editing").forEach(function (form) {
      buildFields(form);
      syncEditor(form);
    });
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
    showDiff(form);
    approve.disabled = differs;
    approve.title = differs ? "Your edit differs from the arguments shown: use Edit & approve" : "";
  }
  function setEditing(form, on) {
    var box = form.querySelector("textarea[name=args]");
    form.classList.toggle("editing", on);
    form.querySelector(".editor").hidden = !on;
    form.querySelector("[data-edit=open]").hidden = on;
    box.disabled = !on; // a closed editor sends nothing
    if (!on) box.value = box.dataset.original;
    buildFields(form);
    if (on) {
      var first = form.querySelector(".arg-fields input, .arg-fields select, .arg-fields textarea");
      var raw = form.querySelector(".raw-json");
      if (first && !(raw && raw.open)) first.focus(); else box.focus();
    }
    syncEditor(form);
  }

  /* --- the per-field editor (docs/dashboard.md#cards): built from the tool's JSON Schema; every change
     is written into the JSON box, which stays the one value sent; editing the box rebuilds the fields.
     Strings, numbers, integers, booleans, enums, nested objects and arrays; anything else is a small
     JSON box of its own. Labels and values are set as text (never markup). --- */
  function resolve(schema, root) {
    var s = schema || {};
    var guard = 0;
    while (s.$ref && guard++ < 20) {
      var name = s.$ref.replace(/^#\/(\$defs|definitions)\//, "");
      s = ((root.$defs || root.definitions || {})[name]) || {};
    }
    var variants = s.anyOf || s.oneOf;
    if (variants) {
      var real = variants.filter(function (v) { return v.type !== "null"; });
      if (real.length === 1) return Object.assign({}, resolve(real[0], root), { nullable: true, title: s.title, description: s.description, default: s.default });
    }
    return s;
  }
  var fieldSeq = 0;
  function labelled(text, control, hint) {
    var wrap = document.createElement("div");
    wrap.className = "arg-field";
    var label = document.createElement("label");
    control.id = control.id || ("argf-" + (++fieldSeq));
    label.htmlFor = control.id;
    label.textContent = text;
    wrap.appendChild(label);
    wrap.appendChild(control);
    if (hint) { var small = document.createElement("small"); small.className = "muted"; small.textContent = hint; wrap.appendChild(small); }
    return wrap;
  }
  /* One control for ``value`` under ``schema``; ``set(v)`` stores a new value (undefined: leave the key out). */
  function control(schema, root, value, set, name) {
    var s = resolve(schema, root);
    var title = name || s.title || "value"; // the argument's own name, as in the JSON (pydantic's titles read "Orderid")
    var hint = s.description || "";
    var el;
    if (Array.isArray(s.enum)) {
      el = document.createElement("select");
      s.enum.forEach(function (option, i) {
        var o = document.createElement("option");
        o.value = String(i);
        o.textContent = typeof option === "string" ? option : JSON.stringify(option);
        if (JSON.stringify(option) === JSON.stringify(value)) o.selected = true;
        el.appendChild(o);
      });
      el.addEventListener("change", function () { set(s.enum[+el.value]); });
      return labelled(title, el, hint);
    }
    var type = Array.isArray(s.type) ? s.type.filter(function (t) { return t !== "null"; })[0] : s.type;
    if (type === "boolean") {
      el = document.createElement("input");
      el.type = "checkbox";
      el.checked = value === true;
      el.addEventListener("change", function () { set(el.checked); });
      var wrap = labelled(title, el, hint);
      wrap.classList.add("check");
      return wrap;
    }
    if (type === "number" || type === "integer") {
      el = document.createElement("input");
      el.type = "number";
      el.step = type === "integer" ? "1" : "any";
      el.value = typeof value === "number" ? String(value) : "";
      el.addEventListener("input", function () {
        if (el.value.trim() === "") { set(s.nullable ? null : undefined); return; }
        var n = Number(el.value);
        if (!isNaN(n)) set(n);
      });
      return labelled(title, el, hint);
    }
    if (type === "string") {
      var long = typeof value === "string" && (value.length > 60 || value.indexOf("\n") >= 0);
      el = document.createElement(long ? "textarea" : "input");
      if (!long) el.type = "text";
      else el.rows = Math.min(8, value.split("\n").length + 1);
      el.value = typeof value === "string" ? value : "";
      el.addEventListener("input", function () { set(el.value); });
      return labelled(title, el, hint);
    }
    if (type === "object" && s.properties && value && typeof value === "object" && !Array.isArray(value)) {
      var group = document.createElement("fieldset");
      group.className = "arg-group";
      var legend = document.createElement("legend");
      legend.textContent = title;
      group.appendChild(legend);
      objectFields(group, s, root, value, function (v) { set(v); });
      return group;
    }
    if (type === "array" && Array.isArray(value)) {
      var list = document.createElement("fieldset");
      list.className = "arg-group arg-array";
      var head = document.createElement("legend");
      head.textContent = title;
      list.appendChild(head);
      var items = value.slice();
      items.forEach(function (item, i) {
        var row = document.createElement("div");
        row.className = "arg-item";
        row.appendChild(control(s.items || {}, root, item, function (v) { items[i] = v; set(items.slice()); }, title + " " + (i + 1)));
        var drop = document.createElement("button");
        drop.type = "button";
        drop.textContent = "Remove";
        drop.addEventListener("click", function () { items.splice(i, 1); set(items.slice(), true); });
        row.appendChild(drop);
        list.appendChild(row);
      });
      var add = document.createElement("button");
      add.type = "button";
      add.textContent = "Add " + (resolve(s.items || {}, root).title || "item");
      add.addEventListener("click", function () { items.push(emptyOf(resolve(s.items || {}, root))); set(items.slice(), true); });
      list.appendChild(add);
      return list;
    }
    // Anything else (a union, a free object): its own small JSON box.
    el = document.createElement("textarea");
    el.className = "code";
    el.rows = 2;
    el.value = value === undefined ? "" : JSON.stringify(value);
    el.addEventListener("input", function () {
      try { set(el.value.trim() === "" ? undefined : JSON.parse(el.value)); el.removeAttribute("aria-invalid"); } catch (e) { el.setAttribute("aria-invalid", "true"); }
    });
    return labelled(title + " (JSON)", el, hint);
  }
  function emptyOf(s) {
    var t = Array.isArray(s.type) ? s.type[0] : s.type;
    return { string: "", number: 0, integer: 0, boolean: false, array: [], object: {} }[t] === undefined ? null : { string: "", number: 0, integer: 0, boolean: false, array: [], object: {} }[t];
  }
  function objectFields(container, schema, root, value, set) {
    var props = schema.properties || {};
    var names = Object.keys(value).concat(Object.keys(props).filter(function (k) { return !(k in value); }));
    var current = Object.assign({}, value);
    names.forEach(function (name) {
      container.appendChild(control(props[name] || {}, root, value[name], function (v, rebuild) {
        if (v === undefined) delete current[name]; else current[name] = v;
        // Keep the order the call had: the JSON box reads like the arguments shown.
        var ordered = {};
        names.forEach(function (k) { if (k in current) ordered[k] = current[k]; });
        set(ordered, rebuild);
      }, name));
    });
  }
  function buildFields(form) {
    var holder = form.querySelector(".arg-fields");
    var box = form.querySelector("textarea[name=args]");
    if (!holder || !box) return;
    var schemaEl = document.getElementById(holder.dataset.schemaId);
    var value;
    try { value = JSON.parse(box.value); } catch (e) { value = null; }
    Array.from(holder.children).forEach(function (c) { if (c.tagName !== "LEGEND") c.remove(); });
    if (!schemaEl || !value || typeof value !== "object" || Array.isArray(value)) {
      holder.hidden = true; // not a JSON object (yet): the raw box is the editor
      return;
    }
    holder.hidden = false;
    var schema = JSON.parse(schemaEl.textContent);
    objectFields(holder, schema, schema, value, function (v, rebuild) {
      box.value = JSON.stringify(v, null, 2);
      syncEditor(form);
      if (rebuild) buildFields(form);
    });
  }
  function describe(v) { return v === undefined ? "" : (typeof v === "string" ? v : JSON.stringify(v)); }
  /* What the edit changes, path by path: "amount 99 → 49.5". */
  function changes(before, after, path, out) {
    var isObj = function (x) { return x && typeof x === "object" && !Array.isArray(x); };
    if (isObj(before) && isObj(after)) {
      Object.keys(before).concat(Object.keys(after).filter(function (k) { return !(k in before); })).forEach(function (k) {
        changes(before[k], after[k], path ? path + "." + k : k, out);
      });
    } else if (canonical(before) !== canonical(after)) {
      out.push({ path: path || "(arguments)", before: before, after: after });
    }
    return out;
  }
  function showDiff(form) {
    var panel = form.querySelector(".edit-diff");
    var box = form.querySelector("textarea[name=args]");
    if (!panel || !box) return;
    var list = panel.querySelector("ul");
    list.textContent = "";
    var before, after;
    try { before = JSON.parse(box.dataset.original); after = JSON.parse(box.value); } catch (e) { panel.hidden = true; return; }
    var found = box.disabled ? [] : changes(before, after, "", []);
    panel.hidden = !found.length;
    found.forEach(function (c) {
      var li = document.createElement("li");
      li.className = "change-" + (c.before === undefined ? "added" : c.after === undefined ? "removed" : "changed");
      var key = document.createElement("span");
      key.className = "arg-key";
      key.textContent = c.path;
      li.appendChild(key);
      li.appendChild(document.createTextNode(" "));
      if (c.before !== undefined) { var del = document.createElement("del"); del.textContent = describe(c.before); li.appendChild(del); li.appendChild(document.createTextNode(" → ")); }
      if (c.after !== undefined) { var ins = document.createElement("ins"); ins.textContent = describe(c.after); li.appendChild(ins); } else { li.appendChild(document.createTextNode("(removed)")); }
      list.appendChild(li);
    });
  }
  document.addEventListener("click", function (event) {
    var toggle = event.target.closest("[data-edit]");
    if (toggle) setEditing(toggle.closest("form"), toggle.dataset.edit === "open");
    if (event.target.closest("[data-keys=open]")) showKeys();
  });
  document.addEventListener("input", function (event) {
    if (event.target.matches(".decide-form textarea[name=args]")) {
      var form = event.target.closest("form");
      syncEditor(form);
      buildFields(form); // the fields follow the JSON box (when it holds an object)
    }
  });

  /* --- keyboard (docs/dashboard.md#keys): j/k move between cards (inbox: between calls), Enter opens a
     call's card from the inbox, a approves, d opens the reason box (Enter in it declines), e edits,
     Esc closes what is open and gives focus back to the card, ? shows the keys --- */
  var ROW = "#threads .row-call[data-tool-call-ref]";
  // After a decision swaps a card away, focus goes to the card now at its place.
  var refocus = null; // {card, index}
  // After any other answer replaces a card (a cancelled confirmation, an error): focus that card again.
  // Tied to the request that asked for it: a slower swap settling meanwhile (the confirmation that Esc
  // already cancels) must not take it away.
  var focusAfterSwap = null; // {id, xhr}

  /* A key "clicks" a button of content htmx may not have taken yet: it takes new content when the swap
     settles, and a click before that would submit the form natively (a full page load that loses focus,
     and the card's state). htmx.process is idempotent. */
  function activate(button) {
    htmx.process(button.form || button);
    button.click();
  }
  function units() { return Array.from(document.querySelectorAll(document.getElementById("calls") ? CARD : ROW)); }
  function cards() { return Array.from(document.querySelectorAll(CARD)); }
  function focusedUnit() {
    var el = document.activeElement;
    return el && el.closest ? el.closest(CARD + ", " + ROW) : null;
  }
  function focusedCard() { return document.activeElement && document.activeElement.closest(CARD); }
  function focusCard(card) {
    if (!card) return;
    card.focus();
    card.scrollIntoView({ block: "nearest" });
  }
  function move(step) {
    var all = units();
    if (!all.length) return;
    var i = all.indexOf(focusedUnit());
    focusCard(all[i < 0 ? 0 : Math.max(0, Math.min(all.length - 1, i + step))]);
  }
  function press(kind) {
    var card = focusedCard();
    if (!card) return;
    // Only the card's own action row: never a confirmation's "Yes, approve" (that takes a deliberate Tab).
    var button = card.querySelector(".actions button[name=action][value=" + kind + "]");
    if (!button || button.disabled || button.hidden) return;
    refocus = { card: card, index: cards().indexOf(card) };
    activate(button); // a high-risk approval answers with its confirmation step, nothing more
  }
  /* The inline decide form of an inbox call (built on demand: a page of 200 threads carries none). */
  function rowForm(row) {
    var form = row.querySelector(".row-decide");
    if (form || !row.dataset.decideUrl) return form;
    form = document.createElement("form");
    form.className = "row-decide";
    form.method = "post";
    form.action = row.dataset.decideUrl;
    form.setAttribute("hx-post", row.dataset.decideUrl);
    form.setAttribute("hx-target", "closest .row-call");
    form.setAttribute("hx-swap", "innerHTML");
    form.hidden = true;
    var fields = document.createElement("fieldset");
    fields.className = "decide";
    function input(type, name, value) {
      var el = document.createElement("input");
      el.type = type; el.name = name; el.value = value;
      return el;
    }
    function button(text, value, cls) {
      var el = document.createElement("button");
      el.type = value === null ? "button" : "submit";
      if (value !== null) { el.name = "action"; el.value = value; }
      el.textContent = text;
      if (cls) el.className = cls;
      return el;
    }
    var blocker = button("", "", ""); // the form's default button, disabled: Enter submits nothing by accident
    blocker.hidden = true; blocker.disabled = true; blocker.setAttribute("aria-hidden", "true");
    fields.appendChild(blocker);
    fields.appendChild(input("hidden", "args_fingerprint", row.dataset.fingerprint));
    var label = document.createElement("label");
    var reason = input("text", "reason", "");
    reason.id = "row-reason-" + Math.random().toString(36).slice(2);
    reason.placeholder = "optional, the agent sees it";
    label.htmlFor = reason.id;
    label.textContent = "Reason";
    fields.appendChild(label);
    fields.appendChild(reason);
    fields.appendChild(button("Decline", "decline", "danger"));
    if (row.dataset.risk !== "high") fields.appendChild(button("Approve", "approve", "primary"));
    var cancel = button("Cancel", null, "");
    cancel.dataset.rowDecide = "close";
    fields.appendChild(cancel);
    form.appendChild(fields);
    row.appendChild(form);
    htmx.process(form);
    return form;
  }
  function openReason(unit) {
    // d: the reason box, armed so that Enter in it declines; nothing is decided yet.
    var form = unit.matches(ROW) ? rowForm(unit) : null;
    if (form) form.hidden = false;
    var box = unit.querySelector(".decline-group input[name=reason], .row-decide input[name=reason]");
    if (!box || box.disabled) return;
    box.dataset.armed = "decline";
    box.focus();
    box.select();
  }
  function closeInline(unit) {
    var form = unit.querySelector(".row-decide");
    if (form) { form.hidden = true; form.reset(); }
    unit.querySelectorAll("[data-armed]").forEach(function (b) { delete b.dataset.armed; });
    focusCard(unit);
  }
  function inboxPress(kind) {
    var row = focusedUnit();
    if (!row || !row.matches(ROW)) return;
    if (kind === "open" || (kind === "approve" && row.dataset.risk === "high") || kind === "edit") {
      location.href = row.dataset.cardUrl; // high risk is confirmed on its card, never from a list
      return;
    }
    if (kind === "decline") { openReason(row); return; }
    var form = rowForm(row);
    var button = form && form.querySelector("button[value=approve]");
    if (button && !button.disabled) activate(button);
  }
  var beforeKeys = null;
  function showKeys() {
    var dialog = document.getElementById("keys-help");
    if (!dialog || dialog.open) return;
    beforeKeys = document.activeElement;
    dialog.addEventListener("close", function () {
      // Back to the card the reviewer had focused, so j/k go on from there. (The close event comes a
      // moment after the dialog hides: never take focus from where a key already moved it.)
      var card = beforeKeys && beforeKeys.closest && beforeKeys.closest(CARD + ", " + ROW);
      if (card && document.body.contains(card) && !focusedUnit()) card.focus();
    }, { once: true });
    dialog.showModal();
  }
  function escape(target) {
    // Esc: close the innermost open thing and give focus back to its card. Dialogs close themselves.
    var unit = target.closest && target.closest(CARD + ", " + ROW);
    var batch = target.closest && target.closest(".batch-confirm");
    if (batch) { activate(batch.querySelector("button[name=cancel]")); return true; }
    if (!unit) return false;
    var confirm = unit.querySelector(".confirm button[name=action][value=cancel]");
    if (confirm) { activate(confirm); return true; } // its answer gives the card the focus (below)
    var form = unit.querySelector(".decide-form.editing");
    if (form && target.closest(".editor")) { setEditing(form, false); focusCard(unit); return true; }
    if (target.matches("input, textarea, select") || unit.querySelector(".row-decide:not([hidden])")) {
      closeInline(unit);
      return true;
    }
    return false;
  }
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.defaultPrevented) return;
    if (!event.target.closest) return;
    if (event.key === "Escape" && !event.target.closest("dialog[open]")) {
      if (escape(event.target)) event.preventDefault();
      return;
    }
    // Enter in a reason box that d opened declines (anywhere else Enter in a text box submits nothing).
    if (event.key === "Enter" && event.target.dataset && event.target.dataset.armed === "decline") {
      var unit = event.target.closest(CARD + ", " + ROW);
      var decline = unit && unit.querySelector("button[name=action][value=decline]");
      if (decline && !decline.disabled) {
        if (unit.matches(CARD)) refocus = { card: unit, index: cards().indexOf(unit) };
        event.preventDefault();
        activate(decline);
      }
      return;
    }
    // Typing is typing; an open dialog has its own keys.
    if (event.target.closest("input, textarea, select, [contenteditable], dialog[open]")) return;
    var onThread = !!document.getElementById("calls");
    if (!onThread && !document.getElementById("threads")) return;
    var handled = true;
    switch (event.key) {
      case "j": move(1); break;
      case "k": move(-1); break;
      case "Enter":
        if (onThread || !focusedUnit()) handled = false; else inboxPress("open");
        break;
      case "a": if (onThread) press("approve"); else inboxPress("approve"); break;
      case "d": {
        var u = focusedUnit();
        if (!u) handled = false; else if (onThread) openReason(u); else inboxPress("decline");
        break;
      }
      case "e": {
        if (!onThread) { inboxPress("edit"); break; }
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
  document.addEventListener("click", function (event) {
    var close = event.target.closest("[data-row-decide=close]");
    if (close) closeInline(close.closest(ROW));
  });
  // A request from inside a card: when its answer replaces the card, focus stays with the card.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var unit = event.detail.elt.closest && event.detail.elt.closest(".call[id]");
    if (unit) focusAfterSwap = { id: unit.id, xhr: event.detail.xhr };
  });
  // The inbox's inline decline answers with a card only when something is wrong (the arguments changed,
  // a refusal): show that on the call's own card, not squeezed into a list row.
  // The element whose request htmx answers (on htmx:beforeSwap, detail.elt is the target, not the asker).
  function asker(event) { return event.detail.requestConfig && event.detail.requestConfig.elt; }

  document.addEventListener("htmx:beforeSwap", function (event) {
    var from = asker(event);
    var form = from && from.closest && from.closest(".row-decide");
    if (form && event.detail.xhr.status !== 200 && /data-tool-call-id=/.test(event.detail.serverResponse || "")) {
      event.detail.shouldSwap = false;
      location.href = form.closest(ROW).dataset.cardUrl;
    }
  });
  document.addEventListener("htmx:afterSettle", function (event) {
    var mine = focusAfterSwap !== null && focusAfterSwap.xhr === event.detail.xhr;
    // Other swaps (the live feed's) may settle first: wait for the decided card to be gone.
    if (refocus !== null && !document.body.contains(refocus.card)) {
      var i = refocus.index;
      refocus = null;
      if (mine) focusAfterSwap = null;
      if (document.activeElement && document.activeElement.closest(".call")) return; // e.g. a confirmation's autofocus
      var all = cards();
      if (all.length) focusCard(all[Math.min(i, all.length - 1)]);
      return;
    }
    if (mine) {
      var el = document.getElementById(focusAfterSwap.id);
      var lost = !document.activeElement || document.activeElement === document.body;
      if (el && lost) {
        if (!el.hasAttribute("tabindex")) el.setAttribute("tabindex", "-1");
        focusCard(el);
      }
      focusAfterSwap = null;
    }
  });
  // Opened from the inbox at a call (#call-…): that card has the focus, so the keys go on from there.
  document.addEventListener("DOMContentLoaded", function () {
    if (location.hash.indexOf("#call-") !== 0) return;
    var card = document.getElementById(location.hash.slice(1));
    if (card) focusCard(card);
  });

  /* --- typed text survives live updates (docs/dashboard.md#keys): a card or inbox call being worked on
     (text typed, an editor or a reason box open) is kept when a live refresh or a re-sync would replace
     it; if the call changed meanwhile the kept card says so, and one click shows the current one. --- */
  var kept = []; // [{key, node}]

  function unitKey(unit) { return unit.id || ("ref:" + unit.dataset.toolCallRef); }
  function findUnit(key) {
    if (key.indexOf("ref:") === 0) {
      var ref = key.slice(4);
      return Array.from(document.querySelectorAll(ROW)).filter(function (r) { return r.dataset.toolCallRef === ref; })[0] || null;
    }
    return document.getElementById(key);
  }
  function busy(unit) {
    if (unit.querySelector(".decide-form.editing, .row-decide:not([hidden]), .changed-meanwhile")) return true;
    return Array.from(unit.querySelectorAll("input[type=text], input[type=number], input:not([type]), textarea, select"))
      .some(function (f) {
        if (f.disabled) return false;
        if (f.tagName === "SELECT") {
          var opts = Array.from(f.options);
          var initial = opts.findIndex(function (o) { return o.defaultSelected; });
          return !f.multiple && f.selectedIndex !== Math.max(0, initial);
        }
        return f.value !== f.defaultValue;
      });
  }
  function markChanged(node, current) {
    var note = node.querySelector(".changed-meanwhile");
    if (!note) {
      note = document.createElement("div");
      note.className = "changed-meanwhile";
      note.setAttribute("role", "status");
      var text = document.createElement("p");
      var show = document.createElement("button");
      show.type = "button";
      show.textContent = "Show the current state";
      show.dataset.showCurrent = "1";
      note.appendChild(text);
      note.appendChild(show);
      node.insertBefore(note, node.firstChild);
    }
    var said = current ? (current.querySelector("p") || current).textContent : "";
    // textContent: whatever the server's fragment holds stays text here.
    note.querySelector("p").textContent = "Changed meanwhile" + (said ? ": " + said.replace(/\s+/g, " ").trim() : " — this call no longer waits here") +
      " Your text is kept; deciding on this card checks the call again.";
    node._current = current || null;
  }
  function keepBusy(root) {
    if (!root || !root.querySelectorAll) return;
    var found = root.matches && root.matches(CARD + ", " + ROW) ? [root] : Array.from(root.querySelectorAll(CARD + ", " + ROW + ", .changed-meanwhile-host"));
    found.forEach(function (unit) {
      if (!busy(unit) || kept.some(function (k) { return k.node === unit; })) return;
      // The swap takes focus away with the node: give it back to the very box, caret included, so the
      // next key typed lands there (and never on the page, where it would be a shortcut).
      var active = unit.contains(document.activeElement) ? document.activeElement : null;
      var caret = null;
      try { caret = active && active.setSelectionRange ? [active.selectionStart, active.selectionEnd] : null; } catch (e) { caret = null; }
      kept.push({ key: unitKey(unit), node: unit, focus: active, caret: caret });
    });
  }
  function restoreKept() {
    if (!kept.length) return;
    var todo = kept;
    kept = [];
    todo.forEach(function (k) {
      if (document.body.contains(k.node)) return; // not replaced after all
      var now = findUnit(k.key);
      var same = now && now.matches(CARD + ", " + ROW) && now.dataset.fingerprint === k.node.dataset.fingerprint &&
        !k.node.querySelector(".changed-meanwhile");
      k.node.classList.add("changed-meanwhile-host");
      if (now) {
        now.replaceWith(k.node);
        if (!same) markChanged(k.node, now);
      } else {
        var list = document.querySelector("#calls") || document.querySelector("#threads");
        if (!list) return;
        var anchor = list.querySelector("#batch");
        if (anchor) anchor.after(k.node); else list.prepend(k.node);
        markChanged(k.node, null);
      }
      if (!same) k.node.classList.add("stale");
      htmx.process(k.node); // the swap cleaned its htmx wiring up: wire it again
      if (k.focus && document.body.contains(k.focus)) {
        k.focus.focus({ preventScroll: true });
        if (k.caret) { try { k.focus.setSelectionRange(k.caret[0], k.caret[1]); } catch (e) { /* not a text box */ } }
      }
    });
    applyLiveState();
  }
  document.addEventListener("htmx:beforeSwap", function (event) {
    if (event.detail.shouldSwap === false) return;
    var target = event.detail.target;
    // Only swaps that replace lists (the live refresh, a re-sync, a page of the inbox); a card's own answer
    // replaces it on purpose.
    if (target && (target.id === "calls" || target.id === "threads")) keepBusy(target);
  });
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var target = event.detail.target;
    // A card this page decided already says so (and follows the outcome): a live notice that the call
    // left, racing with it, must not replace it with "already decided".
    if (target && target.matches && target.matches(".call.done:not(.conflict)")) {
      event.detail.shouldSwap = false;
      return;
    }
    if (target && target.matches && target.matches(CARD) && busy(target)) {
      // A live notice that the call left: keep the card, say so on it.
      event.detail.shouldSwap = false;
      var holder = document.createElement("div");
      holder.appendChild(event.detail.fragment.cloneNode(true));
      markChanged(target, holder.firstElementChild);
      target.classList.add("stale");
    }
  });
  document.addEventListener("htmx:afterSwap", restoreKept);
  document.addEventListener("click", function (event) {
    var show = event.target.closest("[data-show-current]");
    if (!show) return;
    var node = show.closest(".changed-meanwhile-host");
    if (node && node._current) node.replaceWith(node._current);
    else if (node) node.remove();
    if (node && node._current) htmx.process(node._current);
  });

  /* --- batch controls only while more than one call waits on this page (docs/dashboard.md#keys) --- */
  function syncBatch() {
    var ask = document.querySelector("#batch .batch-ask");
    if (!ask) return;
    var open = document.querySelectorAll(CARD + " .actions button[name=action][value=approve]").length;
    ask.hidden = open < 2;
  }
  document.addEventListener("htmx:afterSettle", syncBatch);
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    // A live update never closes a confirmation being read (its list is what the second click decides).
    var target = event.detail.target;
    if (!target || target.id !== "batch") return;
    // Never replaced (a click may be landing on it, a confirmation or a result may be being read): the
    // Approve all / Decline all bar is only added when a second call arrived; syncBatch hides it.
    event.detail.shouldSwap = false;
    if (target.querySelector(".batch-confirm, .batch-ask")) return;
    var holder = document.createElement("div");
    holder.appendChild(event.detail.fragment.cloneNode(true));
    var fresh = holder.querySelector(".batch-ask");
    if (fresh) { target.appendChild(fresh); htmx.process(fresh); }
  });

  /* --- the inbox's live refresh: rows that were not there before are marked new. Only after the
     section's own refresh or the re-sync after an outage (htmx.ajax, from the body): the rows a filter
     or another page brings did not just arrive. --- */
  var rowsBefore = null;
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    var from = asker(event);
    if (target && target.id === "threads" && (from === target || from === document.body)) {
      rowsBefore = new Set(Array.from(document.querySelectorAll("#threads .thread-row")).map(function (r) { return r.dataset.threadId; }));
    }
  });
  document.addEventListener("htmx:afterSwap", function () {
    if (rowsBefore === null) return;
    var before = rowsBefore;
    rowsBefore = null;
    var focused = document.activeElement === document.body ? lastRowRef : null;
    document.querySelectorAll("#threads .thread-row").forEach(function (r) {
      if (before.size && !before.has(r.dataset.threadId)) r.classList.add("is-new");
    });
    if (focused) {
      var again = findUnit("ref:" + focused);
      if (again) again.focus({ preventScroll: true });
    }
  });
  var lastRowRef = null;
  document.addEventListener("focusin", function (event) {
    var row = event.target.closest && event.target.closest(ROW);
    lastRowRef = row ? row.dataset.toolCallRef : null;
  });

  /* --- a decided card becomes its outcome, live (docs/dashboard.md#cards): the tool's result or error
     and the agent's next words, from ws/runs/<id>/ past the decision's seq. Text only: model output and
     tool results are set with textContent, never parsed as markup. --- */
  function followOutcome(box) {
    if (box.dataset.following) return;
    box.dataset.following = "1";
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    var url = scheme + location.host + "/ws/runs/" + encodeURIComponent(box.dataset.followRun) + "/?after=" +
      encodeURIComponent(box.dataset.after);
    var socket = new WebSocket(url);
    var state = box.querySelector(".outcome-state");
    var result = box.querySelector(".outcome-result");
    var words = box.querySelector(".outcome-words");
    var ours = box.dataset.followCall;
    function show(kind, heading, text) {
      result.hidden = false;
      result.dataset.kind = kind;
      result.querySelector(".outcome-result-h").textContent = heading;
      result.querySelector(".outcome-result-body").textContent = text;
    }
    socket.addEventListener("message", function (event) {
      var chunk;
      try { chunk = JSON.parse(event.data); } catch (e) { return; }
      var p = chunk.payload || {};
      if (chunk.type === "tool-result" && p.toolCallId === ours) {
        show("result", "Result", typeof p.result === "string" ? p.result : JSON.stringify(p.result, null, 2));
        state.textContent = "The tool ran.";
      } else if (chunk.type === "tool-error" && p.toolCallId === ours) {
        show("error", "The tool failed", (p.error && p.error.message) || "");
        state.textContent = "The tool failed; the agent was told.";
      } else if (chunk.type === "tool-output-denied" && p.toolCallId === ours) {
        show("denied", "The agent was told", (p.approval && p.approval.reason) || "");
        state.textContent = "Not run.";
      } else if (chunk.type === "text-delta" && typeof p.text === "string") {
        words.hidden = false;
        words.querySelector(".why-text").textContent += p.text;
      } else if (chunk.type === "tool-call-approval" || chunk.type === "tool-call-suspended") {
        state.textContent = "The agent waits for another decision.";
      } else if (chunk.type === "finish") {
        var why = p.finishReason || "";
        if (why !== "suspended") state.textContent = "The run finished" + (why ? " (" + why + ")." : ".");
        socket.close();
        var page = document.querySelector(".thread-page");
        if (page && document.getElementById("recent-messages")) {
          var u = page.dataset.threadUrl;
          htmx.ajax("GET", u + (u.indexOf("?") < 0 ? "?" : "&") + "part=messages", { target: "#recent-messages", swap: "outerHTML" });
        }
      }
    });
    socket.addEventListener("error", function () { state.textContent = "The outcome could not be followed: see the run."; });
  }
  function followOutcomes(root) {
    if (!root || !root.querySelectorAll) return;
    if (root.matches && root.matches("[data-follow-run]")) followOutcome(root);
    root.querySelectorAll("[data-follow-run]").forEach(followOutcome);
  }
  document.addEventListener("htmx:load", function (event) { followOutcomes(event.target); });

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
