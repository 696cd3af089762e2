"""Print where a `make test` run spent its wall time, from OMNIWATCH_TEST_TIMELINE=FILE's lines:
per worker, the units it ran in order (a module's tests merged) with start offset and seconds, and the
busiest worker's total. Usage: python tests/timeline.py FILE [--top N]"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=12, help="units shown per worker")
    a = ap.parse_args()
    rows = [json.loads(x) for x in open(a.file) if x.strip()]
    t0 = min(r["start"] for r in rows)
    end = max(r["end"] for r in rows)
    by_worker: dict[str, list] = defaultdict(list)
    for r in rows:
        by_worker[r["worker"]].append(r)
    print(f"wall {end - t0:.0f} s over {len(by_worker)} workers, {len(rows)} tests")
    for w, rs in sorted(by_worker.items()):
        units: dict[str, list] = {}
        for r in sorted(rs, key=lambda r: r["start"]):
            mod = r["test"].split("::", 1)[0]
            u = units.setdefault(mod, [r["start"], r["end"], 0])
            u[1] = max(u[1], r["end"])
            u[2] += r["end"] - r["start"]
        busy = sum(r["end"] - r["start"] for r in rs)
        last = max(r["end"] for r in rs) - t0
        print(f"\n{w}: busy {busy:.0f} s, last test ends at {last:.0f} s")
        for mod, (s, e, b) in sorted(units.items(), key=lambda kv: -kv[1][2])[: a.top]:
            print(f"  {s - t0:6.0f} s +{b:6.1f} s  {mod}")


if __name__ == "__main__":
    main()
