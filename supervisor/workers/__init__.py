"""Workers: one sidecar (a process, a connection or a call site) behind one interface.

``base`` is the interface and its statistics; ``slots`` the calls in flight every kind composes;
``line``, ``process_json``, ``mcp_client``, ``mcp`` and ``mcp_http`` the long-lived kinds;
``per_call``, ``oneshot`` and ``simple_json`` the process-per-call kinds; ``discovery`` and
``folder_discovery`` what a simple-json folder offers.
"""
