#!/usr/bin/env python3
"""Predicted against measured step time, from `dstrain plan --recommend --measure --json`.

    strategy_stats.py MEASURED.json [PREDICTED.json]

With PREDICTED (a later `--recommend --json` of the same config and world, e.g. after a model
change) the predictions come from it, joined on the layout; the measurements from MEASURED.
Prints the table (fastest measured first), the median absolute relative error, whether the
model's top pick is within 10% of the fastest measured layout, and Spearman's rank correlation.
"""
import json
import statistics
import sys


def key(layout):
    return json.dumps(layout, sort_keys=True)


def describe(l):
    s = f"tp{l['tp']} pp{l['pp']} dp{l['dp']} z{l['zero_stage']} mb{l['micro_batch']}x{l['gradient_accumulation_steps']}"
    return s + (" ckpt" if l["activation_checkpointing"] else "")


def ranks(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.mean(ra), statistics.mean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def main():
    measured = json.load(open(sys.argv[1]))
    recs = measured["recommendations"]
    pred = {key(r["layout"]): r["predicted_ms"] for r in recs}
    if len(sys.argv) > 2:
        pred = {key(r["layout"]): r["predicted_ms"] for r in json.load(open(sys.argv[2]))["recommendations"]}
    rows = []
    for r in recs:
        if r.get("measured_ms") and key(r["layout"]) in pred:
            rows.append((describe(r["layout"]), pred[key(r["layout"])], r["measured_ms"]))
    if not rows:
        print("no measured layouts")
        return
    print(f"{measured['world_size']} ranks, global batch {measured['global_batch']}: {len(rows)} layouts measured "
          f"of {measured['fitting']} that fit; calibration {measured['calibration']['source']}")
    print(f"  {'layout':<28} {'predicted ms':>12} {'measured ms':>12} {'error':>8}")
    for name, p, m in sorted(rows, key=lambda x: x[2]):
        print(f"  {name:<28} {p:>12.0f} {m:>12.0f} {100 * (p - m) / m:>+7.1f}%")
    errs = [abs(p - m) / m for _, p, m in rows]
    top = min(rows, key=lambda x: x[1])
    fastest = min(rows, key=lambda x: x[2])
    rho = spearman([p for _, p, _ in rows], [m for _, _, m in rows])
    print(f"median |error| {100 * statistics.median(errs):.1f}%  (mean {100 * statistics.mean(errs):.1f}%, "
          f"max {100 * max(errs):.1f}%)")
    print(f"top pick {top[0]}: measured {top[2]:.0f} ms, fastest {fastest[0]} {fastest[2]:.0f} ms: "
          f"{100 * (top[2] - fastest[2]) / fastest[2]:+.1f}% ({'within' if top[2] <= 1.1 * fastest[2] else 'NOT within'} 10%)")
    print(f"Spearman rank correlation {rho:.3f}")


if __name__ == "__main__":
    main()
