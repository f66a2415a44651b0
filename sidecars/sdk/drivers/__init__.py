"""The SDK's drivers: the IO loops that serve a sidecar's tools, each on the SDK's shared parts.

``threads`` (the default: every tool sync), ``trio_loop`` (any ``async def`` tool), ``mcp_stdio``
(``--mcp``) and ``oneshot`` (a single Flyflor request). ``sidecars.sdk.app.Sidecar.run`` picks
one; none of them imports the app.
"""
