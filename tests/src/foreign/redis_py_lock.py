"""A lock holder that is not dlock: redis-py's own `Lock`, on one or more servers.

Usage: python3 redis_py_lock.py NAME TIMEOUT_S HOLD_S PORT [PORT ...]

Takes `r.lock(NAME, timeout=TIMEOUT_S)` on every server (127.0.0.1:PORT), prints
`HELD`, holds for HOLD_S seconds, releases them all with `Lock.release` (a
compare-and-delete script that publishes nothing), prints `RELEASED` and exits.
"""

import sys
import time

import redis


def main() -> int:
    name, timeout_s, hold_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    ports = [int(p) for p in sys.argv[4:]]
    locks = []
    for port in ports:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
        lock = client.lock(name, timeout=timeout_s)
        if not lock.acquire(blocking=True, blocking_timeout=5):
            print(f"FAILED to take {name} on port {port}", flush=True)
            return 1
        locks.append(lock)
    print("HELD", flush=True)
    time.sleep(hold_s)
    for lock in locks:
        lock.release()
    print("RELEASED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
