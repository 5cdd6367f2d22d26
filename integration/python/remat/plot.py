"""Memory over time from a remat.trace file: the arena's allocated bytes and the bytes paged out (top), the bytes
evicted, released (freed, still recomputable) and rematerialized so far (bottom), each replay marked as a tick under the top panel.

Usage: python -m remat.plot run.json out.png [--title TEXT]
       python integration/python/remat/plot.py run.json out.png   (the same without importing remat or torch:
                                                                  remat-sim --timeline runs it so)
Exit status: 0 written, 2 bad arguments or a file that is not a remat.trace file, 3 matplotlib missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Tuple

# The counter tracks a remat.trace file (and remat-sim --timeline's) holds; remat._history writes them.
MEMORY = "memory (bytes)"
CUMULATIVE = "evicted, released and rematerialized (bytes, so far)"


def read_trace(path: str) -> Tuple[Dict[str, Dict[str, List[Tuple[float, float]]]], List[float]]:
    """Counter series {counter: {series: [(ms, bytes)]}} and replay start times (ms) from a remat.trace file.
    ValueError when the file is not one."""
    with open(path, "rb") as f:
        try:
            data = json.loads(f.read().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, dict) or data.get("otherData", {}).get("producer") != "remat":
        raise ValueError(f"{path}: not a remat.trace file (no otherData.producer == 'remat')")
    counters: Dict[str, Dict[str, List[Tuple[float, float]]]] = {MEMORY: {}, CUMULATIVE: {}}
    replays: List[float] = []
    for event in data.get("traceEvents", []):
        if event.get("ph") == "C" and event.get("name") in counters:
            for series, value in event["args"].items():
                counters[event["name"]].setdefault(series, []).append((event["ts"] / 1000.0, float(value)))
        elif event.get("ph") == "X" and event.get("cat") == "replay":
            replays.append(event["ts"] / 1000.0)
    if not counters[MEMORY]:
        raise ValueError(f"{path}: no memory counters (was anything recorded under remat.trace?)")
    return counters, replays


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m remat.plot", description=__doc__.splitlines()[0])
    parser.add_argument("trace", help="a file written by `with remat.trace(path):`")
    parser.add_argument("out", help="the image to write (.png, .svg, .pdf)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"remat.plot: matplotlib is not available to {sys.executable}: {e}", file=sys.stderr)
        return 3
    try:
        counters, replays = read_trace(args.trace)
    except (OSError, ValueError) as e:
        print(f"remat.plot: {e}", file=sys.stderr)
        return 2

    mib = 1024.0 * 1024.0
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6), height_ratios=(3, 2))
    for panel, name in ((top, MEMORY), (bottom, CUMULATIVE)):
        for series, points in counters[name].items():
            panel.step([t for t, _ in points], [v / mib for _, v in points], where="post", label=series)
        panel.set_ylabel("MiB")
        panel.legend(loc="upper left")
        panel.grid(alpha=0.3)
    if replays:
        low = top.get_ylim()[0]
        top.plot(replays, [low] * len(replays), "|", color="tab:red", markersize=8, label="replay")
        top.legend(loc="upper left")
    top.set_title(args.title or f"remat: memory over time ({len(replays)} replays)")
    bottom.set_xlabel("time (ms)")
    fig.tight_layout()
    try:
        fig.savefig(args.out, dpi=110)
    except (OSError, ValueError) as e:
        print(f"remat.plot: cannot write {args.out}: {e}", file=sys.stderr)
        return 2
    print(f"remat.plot: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
