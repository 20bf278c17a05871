"""How many CPUs this process may use: the one count every thread pool here sizes itself by."""

import os


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. under taskset or a container's
    cpuset), not the machine's count: more compute threads than that only take turns, and
    ONNX Runtime's spinning workers then slow each other down several-fold."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API on this platform
        return max(1, os.cpu_count() or 1)
