"""The process's resident memory, for the long-run benchmarks (long_run_memory.py, soak.py)."""


def resident_kib():
    """VmRSS of this process, in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")
