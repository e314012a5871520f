// Paddock console: makes a session page's transcript live. It follows the
// session stream (GET /v1/agents/{agent}/sessions/{id}/stream, Server-Sent
// Events; docs/DESIGN.md "The session stream") from the frame the page was
// rendered at, shows a running turn's chunks as they arrive, and replaces
// them with the committed turn. Every text is inserted with textContent,
// never as HTML. No library, no build step.
(function () {
  "use strict";
  var box = document.getElementById("transcript");
  if (!box || !box.getAttribute("data-stream") || !window.EventSource) { return; }
  var status = document.getElementById("live-status");
  var lastTurn = parseInt(box.getAttribute("data-last-turn"), 10) || 0;
  // data-stream names the page's namespace (?namespace=): after= follows it.
  var base = box.getAttribute("data-stream");
  var url = base + (base.indexOf("?") < 0 ? "?" : "&") + "after=" + encodeURIComponent(box.getAttribute("data-after") || "head");
  var live = null; // the element of the turn in flight

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function say(text) { if (status) { status.textContent = text; } }
  function atBottom() { return box.scrollHeight - box.scrollTop - box.clientHeight < 40; }
  function add(node) {
    var stick = atBottom();
    box.appendChild(node);
    if (stick) { box.scrollTop = box.scrollHeight; }
  }
  function message(role, content) {
    var m = el("div", "msg role-" + role);
    m.appendChild(el("span", "role", role));
    m.appendChild(el("span", "content", content));
    return m;
  }
  function liveTurn(head) {
    if (!live) {
      live = el("div", "turn live");
      live.appendChild(el("div", "turn-head", head));
      live.body = message("assistant", "");
      live.appendChild(live.body);
      add(live);
    } else {
      live.firstChild.textContent = head;
    }
    return live;
  }
  function data(ev) {
    try { return JSON.parse(ev.data); } catch (e) { return {}; }
  }

  var es = new EventSource(url, { withCredentials: true });
  es.onopen = function () { say("live"); };
  es.onerror = function () { say(es.readyState === EventSource.CLOSED ? "live updates ended (reload the page)" : "reconnecting…"); };
  es.addEventListener("turn.started", function (ev) {
    var d = data(ev);
    live = null;
    liveTurn("running · event " + d.event_id + " · attempt " + d.attempt);
  });
  es.addEventListener("chunk", function (ev) {
    var d = data(ev);
    var t = liveTurn(live ? live.firstChild.textContent : "running · event " + d.event_id);
    if (d.type === "text") {
      t.body.lastChild.textContent += d.text || "";
    } else {
      t.appendChild(el("pre", "", JSON.stringify(d.data)));
    }
  });
  es.addEventListener("turn.retrying", function (ev) {
    var d = data(ev);
    if (live) { live.remove(); live = null; }
    liveTurn("retrying · event " + d.event_id + " · " + (d.reason || "") + (d.error ? ": " + d.error : ""));
  });
  es.addEventListener("turn.committed", function (ev) {
    var d = data(ev);
    if (live) { live.remove(); live = null; }
    if (d.turn_no <= lastTurn) { return; }
    lastTurn = d.turn_no;
    var t = el("div", "turn");
    t.setAttribute("data-turn", String(d.turn_no));
    t.appendChild(el("div", "turn-head", "turn " + d.turn_no + " · event " + d.event_id + " · " + d.outcome));
    (d.messages || []).forEach(function (m) { t.appendChild(message(m.role, m.content)); });
    add(t);
  });
  es.addEventListener("turn.failed", function (ev) {
    var d = data(ev);
    if (live) { live.remove(); live = null; }
    var t = el("div", "turn failed");
    t.appendChild(el("div", "turn-head", "event " + d.event_id + " failed · " + (d.reason || "") + (d.error ? ": " + d.error : "")));
    add(t);
    if (d.reason === "destroyed") { es.close(); say("session destroyed"); }
  });
  es.addEventListener("wait.opened", function (ev) {
    var d = data(ev);
    var t = el("div", "turn");
    t.appendChild(el("div", "turn-head", "wait opened: " + (d.wait_id || d.id || "") + " (reload to answer it)"));
    add(t);
  });
  es.addEventListener("wait.resolved", function (ev) {
    var d = data(ev);
    var t = el("div", "turn");
    t.appendChild(el("div", "turn-head", "wait resolved: " + (d.wait_id || d.id || "")));
    add(t);
  });
  // The message form posts in the background (the same form, its CSRF
  // token included), so the page stays and the turn streams in.
  var form = document.getElementById("signal-form");
  if (form && window.fetch && window.URLSearchParams && window.FormData) {
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var body = new URLSearchParams(new FormData(form));
      // The field is cleared as the message leaves, not when the answer
      // comes: the turn's reply may stream in first, and what the user
      // types after it must not be wiped. A message not sent comes back
      // if the field is still empty.
      var input = form.querySelector("input[name=message]");
      var sent = input.value;
      input.value = "";
      var restore = function () { if (input.value === "") { input.value = sent; } };
      say("sending…");
      fetch(form.action, { method: "POST", body: body, credentials: "same-origin" }).then(function (resp) {
        return resp.text().then(function (html) {
          if (resp.ok) {
            say("live · sent");
            return;
          }
          restore();
          // The error page's message, read as text from an inert document.
          var doc = new DOMParser().parseFromString(html, "text/html");
          var msg = doc.getElementById("error");
          say("refused (" + resp.status + "): " + (msg ? msg.textContent : resp.statusText));
        });
      }).catch(function (err) { restore(); say("not sent: " + err); });
    });
  }
  es.addEventListener("stream.reset", function () { say("the stream was compacted: reload the page for the full transcript"); });
})();
