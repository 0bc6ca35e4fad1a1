#!/usr/bin/env python3
"""The kernel's floor under a JIT start with cgroups: moving one process into a new cgroup.

A JIT start makes the instance's cgroups and moves the sandbox into them on the request's path.
On cgroup v1 the move takes the kernel's threadgroup rwsem for writing, which waits for an RCU
grace period unless another move happened just before; starts spaced apart each pay it. This
times the move alone (mkdir, then writing a sleeping child's pid to cgroup.procs), spaced as
requests for new labels are and back to back, and removes every cgroup it made.

    sudo python3 bench/cgroup-attach.py [ROUNDS] [SPACING_S]

Needs root and a memory controller (v1 at /sys/fs/cgroup/memory, or v2 at /sys/fs/cgroup).
"""
import os
import statistics
import subprocess
import sys
import time


def hierarchy():
    for base in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup"):
        if os.path.exists(os.path.join(base, "cgroup.procs")) and os.access(base, os.W_OK):
            return base
    sys.exit("no writable cgroup hierarchy with a memory controller (run as root)")


def attach(base, name):
    """Milliseconds to move a fresh child into a new cgroup `name` under `base`."""
    path = os.path.join(base, name)
    os.mkdir(path)
    child = subprocess.Popen(["sleep", "30"])
    try:
        began = time.perf_counter()
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(child.pid))
        return (time.perf_counter() - began) * 1e3
    finally:
        child.kill()
        child.wait()
        # The cgroup can go once its last process is reaped, which the kernel may finish late.
        for _ in range(200):
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.01)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    spacing = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
    rounds = max(1, min(rounds, 100))
    base = hierarchy()
    tag = f"warden-attach-{os.getpid()}"
    spaced = []
    for i in range(rounds):
        time.sleep(spacing)
        spaced.append(attach(base, f"{tag}-s{i}"))
    close = [attach(base, f"{tag}-c{i}") for i in range(rounds)]
    for what, v in ((f"spaced {spacing} s apart", spaced), ("back to back", close)):
        print(
            f"{base}: move into a new cgroup, {what}: median {statistics.median(v):.2f} ms, "
            f"min {min(v):.2f}, max {max(v):.2f} ({len(v)} moves)"
        )


if __name__ == "__main__":
    main()
