"""Child processes.

One class on pid + pidfd, the spawn strategies (exec, zygote), limits, and non-blocking pipe writes.
"""
