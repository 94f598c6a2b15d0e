"""What one fdatasync costs on this disk after the disk was idle for a while.

    .venv/bin/python bench/fsync_gap.py [--syncs 400] [--dir /tmp]

Appends one 283-byte record (a lone put's log entry) and fdatasyncs it,
`--syncs` times per idle gap, the gaps interleaved over three rounds so that
a drift of the machine hits them all alike. On some virtual disks a sync
that follows another at once is cheap and one after an idle spell is not:
a lone write's sync then costs what the pause before it was, and a system
whose round trip is shorter pays less per sync. The last line printed is one
JSON object with the median microseconds per gap.
"""

import argparse
import json
import os
import statistics
import tempfile
import time

GAPS_US = (0, 200, 500, 1000, 2000)
RECORD = b"x" * 283


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--syncs", type=int, default=400, help="syncs per gap and round")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="a folder on the disk to measure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        fd = os.open(os.path.join(folder, "log"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            samples = {gap: [] for gap in GAPS_US}
            offset = 0
            for _ in range(3):
                for gap in GAPS_US:
                    for _ in range(args.syncs):
                        if gap:
                            time.sleep(gap / 1e6)
                        os.pwrite(fd, RECORD, offset)
                        offset += len(RECORD)
                        started = time.perf_counter()
                        os.fdatasync(fd)
                        samples[gap].append((time.perf_counter() - started) * 1e6)
        finally:
            os.close(fd)
    figures = {}
    print(f"{'idle before the sync':>22}  {'p50 us':>7}  {'p90 us':>7}")
    for gap, values in samples.items():
        p50, p90 = statistics.median(values), statistics.quantiles(values, n=10)[8]
        print(f"{gap / 1000:>19.1f} ms  {p50:7.0f}  {p90:7.0f}")
        figures[f"fdatasync_p50_us_after_{gap}us_idle"] = round(p50)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
