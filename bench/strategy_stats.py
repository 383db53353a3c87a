#!/usr/bin/env python3
"""Predicted against measured step time, from `dstrain plan --recommend --measure --json`.

    strategy_stats.py MEASURED.json [PREDICTED.json]

With PREDICTED (a later `--recommend --json` of the same config and world, e.g. after a model
change) the predictions come from it, joined on the layout; the measurements from MEASURED.
Prints the table (fastest measured first), the median absolute relative error, whether the
model's top pick is within 10% of the fastest measured layout, Spearman's rank correlation, and a
noise floor: how far layouts that differ only in the ZeRO stage (nearly the same work) scatter.
"""
import json
import statistics
import sys


def key(layout):
    return json.dumps(layout, sort_keys=True)


def describe(l):
    s = f"tp{l['tp']} pp{l['pp']} dp{l['dp']} z{l['zero_stage']} mb{l['micro_batch']}x{l['gradient_accumulation_steps']}"
    return s + (" ckpt" if l["activation_checkpointing"] else "")


def same_work(l):
    return (l["tp"], l["pp"], l["dp"], l["micro_batch"], l["gradient_accumulation_steps"], l["activation_checkpointing"])


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
    groups, gpred = {}, {}
    for r in recs:
        if r.get("measured_ms") and key(r["layout"]) in pred:
            groups.setdefault(same_work(r["layout"]), []).append(r["measured_ms"])
            gpred.setdefault(same_work(r["layout"]), []).append(pred[key(r["layout"])])
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
    # The measurement's own noise: layouts that differ only in the ZeRO stage do nearly the same
    # work (the same at dp 1), so their spread around their group's median is a floor for the error.
    dev = [abs(x - statistics.median(g)) / statistics.median(g) for g in groups.values() if len(g) > 1 for x in g]
    if dev:
        print(f"noise floor: layouts differing only in ZeRO stage deviate {100 * statistics.median(dev):.1f}% "
              f"(median; max {100 * max(dev):.1f}%) from their group's median measured time")
        ks = list(groups)
        gp = [statistics.mean(gpred[k]) for k in ks]
        gm = [statistics.median(groups[k]) for k in ks]
        best = min(range(len(ks)), key=lambda i: gp[i])
        print(f"over the {len(ks)} groups (ZeRO stages pooled, median measured): median |error| "
              f"{100 * statistics.median([abs(p - m) / m for p, m in zip(gp, gm)]):.1f}%, Spearman "
              f"{spearman(gp, gm):.3f}, top group {100 * (gm[best] - min(gm)) / min(gm):+.1f}% from the fastest")


if __name__ == "__main__":
    main()
