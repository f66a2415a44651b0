"""Sans-IO sidecar protocols: bytes in -> messages out, messages in -> bytes out.

Nothing here imports trio or touches processes; the runtime drives these objects.
"""
