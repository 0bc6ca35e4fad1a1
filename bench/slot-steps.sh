#!/usr/bin/env bash
# Where a slot start's time goes, step by step: `warden-bench starts --paths slot` under a light
# `perf record` of the system calls that mark each step, then the median and mean of each:
#   message -> execve   the agent's start message until the app's process execs it
#   execve -> listen    the app's own start
#   listen -> word      until the agent reads init's word that the app accepts
#   word -> writev      until the gateway writes the waiting request to the app
# Needs perf and root (system-wide tracepoints).
#   DIR=path bash bench/slot-steps.sh [N]   (DIR holds warden, warden-bench and warden-instance;
#                                            without it this tree's release build; N: starts, 20)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20}
if [ -z "${DIR:-}" ]; then
  cargo build --release --locked -p warden -p warden-bench
  DIR=target/release
fi
work=$(mktemp -d /tmp/slot-steps.XXXXXX)
trap 'rm -rf "$work"' EXIT
events=syscalls:sys_enter_sendto,syscalls:sys_enter_execve,syscalls:sys_exit_listen
events=$events,syscalls:sys_exit_recvmsg,syscalls:sys_enter_writev,syscalls:sys_enter_sendmsg
perf record -q -a -o "$work/p.perf" -e "$events" --exclude-perf -- \
  "$DIR/warden-bench" starts --warden "$DIR/warden" --paths slot --runs "$n" --idle 0 \
  > "$work/bench.out" 2>&1
grep -E '^\| (slot|floor: fork)' "$work/bench.out" || true
perf script -i "$work/p.perf" -F comm,pid,tid,time,event,trace 2>/dev/null | python3 -c '
import re, statistics as st, sys
pat = re.compile(r"\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)")
events = [m.groups() for m in map(pat.match, sys.stdin) if m]
rows, i = [], 0
for k, (comm, pid, tid, t, ev, rest) in enumerate(events):
    # The app process of a slot is forked by init and named like init (a digit) until it execs.
    if not (ev.endswith("sys_enter_execve") and comm.isdigit()):
        continue
    msg = next((float(e[3]) for e in reversed(events[i:k])
                if e[4].endswith("sys_enter_sendto") and e[0].startswith("tokio")), None)
    i = k
    marks, want = [float(t)], ["listen", "word", "writev"]
    for e in events[k + 1:]:
        if not want:
            break
        w = want[0]
        if (w == "listen" and e[4].endswith("sys_exit_listen") and e[1] == pid) or \
           (w == "word" and e[4].endswith("sys_exit_recvmsg") and e[5].strip() == "0x1"
            and e[0].startswith("tokio")) or \
           (w == "writev" and e[0].startswith("tokio") and (e[4].endswith("sys_enter_sendmsg")
            or (e[4].endswith("sys_enter_writev") and "vlen: 0x00000003" in e[5]))):
            marks.append(float(e[3]))
            want.pop(0)
    if msg is not None and not want:
        rows.append([(b - a) * 1e3 for a, b in zip([msg] + marks, marks)])
if not rows:
    sys.exit("no slot start seen")
print(f"{len(rows)} slot starts (ms):")
for j, name in enumerate(["message -> execve", "execve -> listen", "listen -> word", "word -> writev"]):
    col = [r[j] for r in rows]
    print(f"  {name:18} median {st.median(col):.3f}  mean {st.mean(col):.3f}")
'
