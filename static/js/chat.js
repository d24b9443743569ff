// Streaming answers: SSE "status" events carry its stages: in a conversation with
// documents {"state": "retrieving"}, then {"state": "generating", "sources": [...]}; while
// it waits for room its place in the queue ({"state": "queued", "ahead": N}, then
// {"state": "running"}); while a model freed when idle loads again {"state": "loading"}; then "token"
// events carry JSON {"delta": "..."}, appended as text nodes (never parsed as HTML); the
// final "done" event is swapped in by htmx as the saved, server-rendered answer.
(function () {
  "use strict";

  function lastSeq(article) {
    return Number(article.dataset.lastSeq || 0);
  }

  function waitingWords(status) {
    if (status.state === "retrieving") return "Searching your documents\u2026";
    if (status.state === "loading") return "Loading the model\u2026";
    if (status.state !== "queued") return "";
    return status.ahead > 0 ? "Waiting \u2014 " + status.ahead + " ahead" : "Waiting \u2014 next in line";
  }

  // The sources an answer's prompt carries, as the server renders them (generation/_sources.html),
  // built from text nodes; a list the page already shows (a reload replays the event) stays.
  function showSources(article, sources) {
    var list = article.querySelector("[data-sources]");
    if (!list || list.children.length || !sources || !sources.length) return;
    sources.forEach(function (source) {
      var item = document.createElement("li");
      var link = document.createElement("a");
      link.href = source.url;
      link.textContent = "[" + source.number + "] " + source.document;
      var excerpt = document.createElement("span");
      excerpt.className = "source-excerpt";
      excerpt.textContent = source.excerpt;
      item.append(link, " ", excerpt);
      list.append(item);
    });
    list.hidden = false;
  }

  // A tool call's block, as the server renders it (tools/_tool_calls.html), built from text
  // nodes: arguments and results are text, never HTML. "tool_start" adds it (running),
  // "tool_result" fills it in; one block per call id, however often the events come.
  var TOOL_STATUS = { waiting: "Waiting for your approval", running: "Running\u2026", ok: "Ok", error: "Error" };

  // A call that waits for its owner ("Ask every time"): Approve and Deny post the decision
  // to the list's data-decision-url; the call's next event takes the buttons away.
  function showDecision(list, item, call) {
    var buttons = item.querySelector("[data-tool-decision]");
    if (call.status !== "waiting") {
      if (buttons) buttons.remove();
      return;
    }
    if (buttons || !list.dataset.decisionUrl) return;
    buttons = document.createElement("div");
    buttons.className = "tool-decision";
    buttons.setAttribute("data-tool-decision", "");
    [["approve", "Approve"], ["deny", "Deny"]].forEach(function (choice) {
      var button = document.createElement("button");
      button.type = "button";
      button.className = choice[0] === "deny" ? "secondary" : "";
      button.textContent = choice[1];
      button.addEventListener("click", function () {
        buttons.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
        htmx.ajax("POST", list.dataset.decisionUrl, {
          source: button,
          swap: "none",
          values: { call_id: call.id, decision: choice[0] },
        });
      });
      buttons.append(button);
    });
    item.append(buttons);
  }

  function toolPart(parent, tag, attribute, text) {
    var part = parent.querySelector("[" + attribute + "]");
    if (!part) {
      part = document.createElement(tag);
      part.setAttribute(attribute, "");
      parent.append(part);
    }
    part.textContent = text;
    return part;
  }

  function showToolCall(article, call) {
    var list = article.querySelector("[data-tool-calls]");
    if (!list) return;
    var item = Array.prototype.find.call(list.children, function (child) {
      return child.dataset.toolCall === call.id;
    });
    if (!item) {
      item = document.createElement("li");
      item.className = "tool-call";
      item.dataset.toolCall = call.id;
      var details = document.createElement("details");
      var summary = document.createElement("summary");
      summary.append("Tool ");
      toolPart(summary, "code", "data-tool-name", call.name);
      summary.append(" \u00b7 ");
      toolPart(summary, "span", "data-tool-status", "");
      summary.append(" \u00b7 ");
      toolPart(summary, "span", "data-tool-time", "");
      details.append(summary);
      [["Arguments", "data-tool-arguments"], ["Result", "data-tool-result"]].forEach(function (part) {
        var label = document.createElement("p");
        label.className = "tool-label";
        label.textContent = part[0];
        details.append(label);
        toolPart(details, "pre", part[1], "");
      });
      item.append(details);
      list.append(item);
    }
    item.dataset.status = call.status;
    toolPart(item, "span", "data-tool-status", TOOL_STATUS[call.status] || call.status);
    toolPart(item, "span", "data-tool-time", call.duration_ms === undefined ? "" : call.duration_ms + " ms");
    toolPart(item, "pre", "data-tool-arguments", call.arguments);
    toolPart(item, "pre", "data-tool-result", call.result === undefined ? "" : call.result);
    showDecision(list, item, call);
    if (call.status === "waiting") item.querySelector("details").open = true;
  }

  document.addEventListener("htmx:sseBeforeMessage", function (event) {
    var message = event.detail;
    var isTool = message.type === "tool_start" || message.type === "tool_result";
    if (message.type !== "token" && message.type !== "status" && !isTool) return;
    event.preventDefault(); // no htmx swap: update the answer ourselves
    var article = event.target.closest("article");
    var seq = Number(message.lastEventId);
    if (seq && seq <= lastSeq(article)) return; // already shown (replayed after a reconnect)
    article.dataset.lastSeq = seq;
    var data = JSON.parse(message.data);
    var statusLine = article.querySelector("[data-stream-status]");
    if (isTool) {
      if (statusLine) statusLine.textContent = "";
      showToolCall(article, data);
      return;
    }
    if (message.type === "status") {
      if (statusLine) statusLine.textContent = waitingWords(data);
      if (data.state === "generating") showSources(article, data.sources);
      return;
    }
    if (statusLine) statusLine.textContent = ""; // it runs: no longer waiting
    article.querySelector("[data-stream-text]").append(document.createTextNode(data.delta));
  });

  // When the SSE extension reconnects it opens a new EventSource, which sends no
  // Last-Event-ID: carry the resume point in the URL so nothing is replayed twice.
  htmx.createEventSource = function (url) {
    var source = document.querySelector('[sse-connect="' + CSS.escape(url) + '"]');
    var after = source ? lastSeq(source) : 0;
    var resumeUrl = after ? url + (url.indexOf("?") < 0 ? "?" : "&") + "after=" + after : url;
    return new EventSource(resumeUrl, { withCredentials: true });
  };

  // A Copy button on each code block of a rendered answer; added here, not in the
  // server's HTML, so that without JavaScript there is no button that does nothing.
  function addCopyButtons(root) {
    root.querySelectorAll(".markdown pre > code").forEach(function (code) {
      var pre = code.parentElement;
      if (pre.parentElement.classList.contains("code-block")) return; // already done
      var button = document.createElement("button");
      button.type = "button";
      button.className = "secondary copy-code";
      button.textContent = "Copy";
      button.setAttribute("aria-label", "Copy code");
      var block = document.createElement("div");
      block.className = "code-block";
      pre.replaceWith(block);
      block.append(button, pre);
    });
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest(".copy-code");
    if (!button) return;
    var code = button.parentElement.querySelector("code");
    var selectCode = function () { window.getSelection().selectAllChildren(code); }; // to copy by hand
    if (!navigator.clipboard) return selectCode(); // plain http: no Clipboard API
    navigator.clipboard.writeText(code.textContent).then(function () {
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    }, selectCode);
  });

  htmx.onLoad(addCopyButtons); // the page, then each swapped-in fragment (e.g. a finished answer)

  // A document upload's progress, from htmx's XMLHttpRequest upload events.
  document.addEventListener("htmx:xhr:progress", function (event) {
    var progress = event.target.querySelector && event.target.querySelector("[data-upload-progress]");
    if (!progress || !event.detail.lengthComputable) return;
    progress.hidden = false;
    progress.value = Math.round((event.detail.loaded / event.detail.total) * 100);
  });

  // Enter sends, Shift+Enter makes a new line.
  document.addEventListener("keydown", function (event) {
    var field = event.target;
    if (event.key !== "Enter" || event.shiftKey || event.isComposing) return;
    if (!(field instanceof HTMLTextAreaElement) || !field.form || field.form.id !== "composer") return;
    event.preventDefault();
    field.form.requestSubmit();
  });

  // Keep focus in the message box after a send replaces the composer.
  document.addEventListener("htmx:afterSettle", function () {
    var field = document.querySelector("#composer textarea");
    if (field && document.activeElement === document.body) field.focus();
  });
})();
