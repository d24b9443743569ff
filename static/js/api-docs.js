// Starts Swagger UI on /v1/docs with the document named by the page (no inline code: CSP).
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const root = document.getElementById("swagger-ui");
  window.SwaggerUIBundle({
    domNode: root,
    url: root.dataset.url,
    deepLinking: true,
    tryItOutEnabled: false,
    // No call to swagger.io's validator: the page talks only to this site.
    validatorUrl: null,
  });
});
