// /docs: Swagger UI on /openapi.json, every file served by the push service itself (no
// third-party script on the origin whose pages hold the admin key), under a CSP that
// allows scripts from this origin only; hence this file, not an inline script.
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null, // no badge from validator.swagger.io
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
