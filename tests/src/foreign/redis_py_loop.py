"""A client that does not queue: redis-py's `Lock` taken in a loop for a while.

Usage: python3 redis_py_loop.py NAME PORT HOLD_S FOR_S MARKS_FILE

For FOR_S seconds: `r.lock(NAME, timeout=10).acquire()` as redis-py does by
default (a `SET NX PX` every 0.1 s until it succeeds), appends
`start <pid> py` to MARKS_FILE, holds for HOLD_S, appends `end <pid> py`,
releases, then works HOLD_S outside the lock before the next cycle (a
client that takes the key again the instant it let it go would keep it from
any waiter that must first hear of the release). Prints `GRANTS <n>`.
"""

import os
import sys
import time

import redis


def main() -> int:
    name, port = sys.argv[1], int(sys.argv[2])
    hold_s, for_s, marks = float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    pid = os.getpid()
    grants = 0
    stop_at = time.monotonic() + for_s
    while time.monotonic() < stop_at:
        lock = client.lock(name, timeout=10)
        left = stop_at - time.monotonic()
        if left <= 0 or not lock.acquire(blocking=True, blocking_timeout=left):
            break
        with open(marks, "a") as f:
            f.write(f"start {pid} py\n")
        time.sleep(hold_s)
        with open(marks, "a") as f:
            f.write(f"end {pid} py\n")
        lock.release()
        grants += 1
        time.sleep(hold_s)
    print(f"GRANTS {grants}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
