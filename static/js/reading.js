// Reading a conversation: the view follows a growing answer until the reader scrolls up,
// then offers "Jump to latest"; Copy puts an answer's Markdown on the clipboard; Esc stops
// the running answer; Ctrl/Cmd+Shift+O opens a new chat; on phones the conversation list
// is a drawer. (Shortcuts are listed in generation/_shortcuts.html.)
(function () {
  "use strict";

  var scroller = document.scrollingElement || document.documentElement;
  var NEAR_BOTTOM_PX = 80; // closer than this counts as "at the latest"
  var following = true;

  function atBottom() {
    return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < NEAR_BOTTOM_PX;
  }

  function showJump(show) {
    var button = document.querySelector(".jump-latest");
    if (button) button.hidden = !show;
  }

  function streamingAnswer() {
    var answers = document.querySelectorAll('article[data-role="assistant"][data-status="streaming"]');
    return answers[answers.length - 1] || null;
  }

  function jumpToLatest() {
    following = true;
    showJump(false);
    scroller.scrollTop = scroller.scrollHeight;
  }

  // Our own scrolling lands at the bottom, so only the reader's can turn following off.
  window.addEventListener("scroll", function () {
    following = atBottom();
    showJump(!following && streamingAnswer() !== null);
  }, { passive: true });

  function contentGrew() {
    if (following) scroller.scrollTop = scroller.scrollHeight;
    else showJump(true);
  }

  document.addEventListener("DOMContentLoaded", function () {
    var messages = document.getElementById("messages");
    if (!messages) return;
    jumpToLatest(); // a conversation opens at its latest message, as in other chat apps
    new MutationObserver(contentGrew).observe(messages, { childList: true, subtree: true, characterData: true });
  });

  // Whoever sends a prompt wants to see it and its answer.
  document.addEventListener("submit", function (event) {
    if (event.target.id === "composer") following = true;
  });

  // Copy on each finished answer, made here so that without scripts no button does nothing.
  function addAnswerCopyButtons(root) {
    root.querySelectorAll("template[data-answer-source]").forEach(function (source) {
      var footer = source.closest("article").querySelector(".message-meta");
      if (!footer || footer.querySelector(".copy-answer")) return;
      var button = document.createElement("button");
      button.type = "button";
      button.className = "secondary copy-answer";
      button.textContent = "Copy";
      button.setAttribute("aria-label", "Copy answer");
      footer.insertBefore(button, footer.querySelector(".message-controls"));
    });
  }

  htmx.onLoad(addAnswerCopyButtons);

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest(".copy-answer");
    if (button) copyAnswer(button);
    if (event.target.closest && event.target.closest(".jump-latest")) jumpToLatest();
  });

  function copyAnswer(button) {
    var source = button.closest("article").querySelector("template[data-answer-source]");
    if (!navigator.clipboard) return; // plain http: no Clipboard API (the text can still be selected)
    navigator.clipboard.writeText(source.content.textContent).then(function () {
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    }, function () {
      button.textContent = "Copy failed";
    });
  }

  // The phone layout's drawer (app.css shows .drawer-bar on narrow screens only).
  function drawerToggle() {
    return document.querySelector(".drawer-toggle");
  }

  function drawerOpen() {
    var toggle = drawerToggle();
    return toggle !== null && toggle.getAttribute("aria-expanded") === "true";
  }

  function setDrawer(open, focusAfter) {
    var toggle = drawerToggle();
    if (!toggle) return;
    toggle.setAttribute("aria-expanded", String(open));
    document.documentElement.classList.toggle("drawer-open", open);
    if (open) {
      var first = document.getElementById("sidebar").querySelector("a[href], input, button");
      if (first) first.focus();
    } else if (focusAfter) {
      toggle.focus();
    }
  }

  document.addEventListener("click", function (event) {
    if (!event.target.closest) return;
    if (event.target.closest(".drawer-toggle")) return setDrawer(!drawerOpen(), false);
    if (!drawerOpen()) return;
    var sidebar = document.getElementById("sidebar");
    // A chosen conversation, or a click beside the drawer, closes it.
    if (!sidebar.contains(event.target) || event.target.closest("#conversations a, #search-results a")) {
      setDrawer(false, false);
    }
  });

  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && !event.isComposing) {
      if (drawerOpen()) {
        event.preventDefault();
        return setDrawer(false, true);
      }
      var answer = streamingAnswer();
      var stop = answer && answer.querySelector("form.message-actions");
      if (stop) {
        event.preventDefault();
        stop.requestSubmit();
      }
      return;
    }
    if ((event.ctrlKey || event.metaKey) && event.shiftKey && event.code === "KeyO") {
      var newChat = document.querySelector("[data-new-chat]");
      if (newChat) {
        event.preventDefault();
        newChat.click();
      }
    }
  });
})();
