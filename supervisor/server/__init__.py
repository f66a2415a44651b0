"""Serving the kernel protocol (PROTOCOL 6) over the Unix socket and the WebSocket."""
