"""soul-runtime as a service: a JSON API and an MCP server for tenants with API keys, hosted on Ray Serve."""

INGRESSES = ("auto", "haproxy", "proxy")
"""How ``soul serve`` takes HTTP in (:func:`soul_apps.service.serve_app.ingress_env`); here so the command line can name
them without importing Ray Serve."""
