"""soul-runtime as a service: a JSON API and an MCP server for tenants with API keys, hosted on Ray Serve."""
