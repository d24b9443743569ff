// Runs in <head>, before the page is painted (so no flash of the wrong theme): the colour
// theme chosen on this browser ("light" or "dark"; none stored: the system's), and a mark
// that scripts run, which the phone layout's drawer needs (app.css: .scripted).
(function () {
  "use strict";

  var KEY = "chatsite-theme";
  var THEMES = ["light", "dark"];
  var root = document.documentElement;

  function stored() {
    try {
      return localStorage.getItem(KEY);
    } catch (error) {
      return null; // storage refused (e.g. blocked cookies): the system's theme
    }
  }

  function apply(theme) {
    if (THEMES.indexOf(theme) >= 0) root.dataset.theme = theme;
    else delete root.dataset.theme;
  }

  function remember(theme) {
    try {
      if (THEMES.indexOf(theme) >= 0) localStorage.setItem(KEY, theme);
      else localStorage.removeItem(KEY);
    } catch (error) { /* applied to this page only */ }
  }

  root.classList.add("scripted");
  apply(stored());

  document.addEventListener("DOMContentLoaded", function () {
    var choice = document.querySelector("[data-theme-switch]");
    if (!choice) return;
    choice.value = root.dataset.theme || "system";
    choice.closest(".theme-switch").hidden = false; // without scripts it could do nothing
    choice.addEventListener("change", function () {
      remember(choice.value);
      apply(choice.value);
    });
  });

  // A choice made in another tab applies here too.
  window.addEventListener("storage", function (event) {
    if (event.key !== KEY) return;
    apply(event.newValue);
    var choice = document.querySelector("[data-theme-switch]");
    if (choice) choice.value = root.dataset.theme || "system";
  });
})();
