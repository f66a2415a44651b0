"""Child processes: how a sidecar process starts, runs confined to the host's life, and is reaped.

Bottom up: ``linux`` (prctl, rlimits, the subreaper flag; standard library only), ``limits``
(the rlimits of a worker), ``warden`` (kills the host's process groups when it dies), ``child``
(one process on pid + pidfd, exec'd or forked), ``spawn`` (the Spawner: exec, or the zygote),
``zygote`` (the host's side of the fork server) and ``zygote_main`` (the fork server itself);
``direct_write`` writes to non-blocking pipes and sockets.
"""
