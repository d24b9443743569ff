// Streaming answers: tokens arrive as SSE "token" events carrying JSON {"delta": "..."}.
// They are appended as text nodes (never parsed as HTML); the final "done" event is
// swapped in by htmx as the saved, server-rendered answer.
(function () {
  "use strict";

  function lastSeq(article) {
    return Number(article.dataset.lastSeq || 0);
  }

  document.addEventListener("htmx:sseBeforeMessage", function (event) {
    var message = event.detail;
    if (message.type !== "token") return;
    event.preventDefault(); // no htmx swap: append text ourselves
    var article = event.target.closest("article");
    var seq = Number(message.lastEventId);
    if (seq && seq <= lastSeq(article)) return; // already shown (replayed after a reconnect)
    article.dataset.lastSeq = seq;
    event.target.append(document.createTextNode(JSON.parse(message.data).delta));
  });

  // When the SSE extension reconnects it opens a new EventSource, which sends no
  // Last-Event-ID: carry the resume point in the URL so nothing is replayed twice.
  htmx.createEventSource = function (url) {
    var source = document.querySelector('[sse-connect="' + CSS.escape(url) + '"]');
    var after = source ? lastSeq(source) : 0;
    var resumeUrl = after ? url + (url.indexOf("?") < 0 ? "?" : "&") + "after=" + after : url;
    return new EventSource(resumeUrl, { withCredentials: true });
  };

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
