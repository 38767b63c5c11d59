"""Prints the A/B table of `ab.sh`'s runs: each row's best time of build A and of build B (the
minimum of the runs' `ms`, each build on its own: a table of the best over both builds hides
the slower one), B's change, and each build's % of the copy ceiling."""
import glob
import json
import sys


def best(paths):
    rows = {}
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"ab: {path}: {e}")
            continue
        for r in doc["rows"]:
            if r.get("ms") is None:
                continue
            key = (r["id"], r["variant"])
            old = rows.get(key)
            if old is None or r["ms"] < old["ms"]:
                rows[key] = r
    return rows


def pct(r):
    return "-" if r is None or r.get("of_copy") is None else f"{100 * r['of_copy']:.0f}%"


def main(out):
    a = best(sorted(glob.glob(f"{out}/ab_a*.json")))
    b = best(sorted(glob.glob(f"{out}/ab_b*.json")))
    print(f"{'id':<5} {'variant':<40} {'A ms':>9} {'B ms':>9} {'B/A':>7}  A%   B%")
    for key in sorted(set(a) | set(b), key=lambda k: (k[0], k[1])):
        ra, rb = a.get(key), b.get(key)
        ma = ra["ms"] if ra else None
        mb = rb["ms"] if rb else None
        ratio = f"{mb / ma:.3f}" if ma and mb else "-"
        flag = " *" if ma and mb and abs(mb / ma - 1) > 0.01 else ""
        fa = f"{ma:.4f}" if ma else "-"
        fb = f"{mb:.4f}" if mb else "-"
        print(f"{key[0]:<5} {key[1][:40]:<40} {fa:>9} {fb:>9} {ratio:>7} {pct(ra):>4} {pct(rb):>4}{flag}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp")
