"""The E2B backend: E2B's REST lifecycle API and envd's Connect-RPC API, native on trio."""
