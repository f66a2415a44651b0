"""Workers.

One sidecar (a process, a connection or a call site) behind one interface, per protocol.
"""
