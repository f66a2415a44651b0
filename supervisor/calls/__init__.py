"""The call path.

The Call state machine, its timers, the invoker with its gate, quotas, approvals and audit.
"""
