"""A client that does not queue, blocking on keys that others take now and then.

Usage: python3 redis_py_blocking.py PORT WAIT_S HOLD_S NAME [NAME ...]

For each NAME in turn: `r.lock(NAME, timeout=10).acquire(blocking=True,
blocking_timeout=WAIT_S)` (redis-py's blocking acquire: a `SET NX PX` every
0.1 s until it succeeds or WAIT_S passes), holds for HOLD_S, releases.
Prints `WAITED <name> <seconds>` for a grant, `REFUSED <name>` for a wait
that ran out, and last `GRANTS <n>`.
"""

import sys
import time

import redis


def main() -> int:
    port, wait_s, hold_s = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    names = sys.argv[4:]
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    grants = 0
    for name in names:
        lock = client.lock(name, timeout=10)
        started = time.monotonic()
        if not lock.acquire(blocking=True, blocking_timeout=wait_s):
            print(f"REFUSED {name}", flush=True)
            continue
        print(f"WAITED {name} {time.monotonic() - started:.3f}", flush=True)
        time.sleep(hold_s)
        lock.release()
        grants += 1
    print(f"GRANTS {grants}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
