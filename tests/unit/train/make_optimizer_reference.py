#!/usr/bin/python3
# Prints the reference digests stored in tests/unit/train/optimizer_types_test.cpp: an independent
# NumPy model (float32 element math, float64 norms) of each optimizer's formula as DeepSpeed's
# classes write it (FusedLamb, DeepSpeedCPUAdagrad, FusedLion, OnebitAdam, ZeroOneAdam, OnebitLamb)
# and of the 1-bit compressed all-reduce with error feedback. Run with Debian's python3-numpy:
#   /usr/bin/python3 tests/unit/train/make_optimizer_reference.py
import numpy as np

f32 = np.float32
# The tiny GPT-2 of the test (n_layer 1, n_embd 32, vocab 64, seq_len 8): its tensors in the flat
# layout's order, (numel, weight decay: the 2-D ones), one tensor index each.
LAYOUT = [(2048, 1), (256, 1), (32, 0), (32, 0), (3072, 1), (96, 0), (1024, 1), (32, 0), (32, 0), (32, 0),
          (4096, 1), (128, 0), (4096, 1), (32, 0), (32, 0), (32, 0)]
N = sum(n for n, _ in LAYOUT)
OFFS = np.cumsum([0] + [n for n, _ in LAYOUT])
DECAY = np.concatenate([np.full(n, d, dtype=bool) for n, d in LAYOUT])
PICK = [0, 1, 777, 2047, 2048, 5000, 9999, N - 1]
BLK = 2048


def init_params():
    i = np.arange(N, dtype=np.float64)
    return (0.02 * np.sin(0.71 * i + 0.3)).astype(f32)


def grads(t, r=0):
    i = np.arange(N, dtype=np.float64)
    return (0.1 * np.sin(0.37 * i + 1.3 * t + 0.9 * r) * (0.5 + 0.5 * np.cos(0.11 * i + 0.2 * r))).astype(f32)


def segs():
    return [(OFFS[k], OFFS[k + 1], d) for k, (_, d) in enumerate(LAYOUT)]


def direction(p, m, v, eps, wd_mask, wd, inside=False):
    denom = np.sqrt(v + f32(eps)) if inside else np.sqrt(v) + f32(eps)
    q = m / denom
    u = q + np.where(wd_mask, f32(wd), f32(0)) * p
    return q, u


def sq(x):
    return float(np.sum(x.astype(np.float64) ** 2))


def moments(m, v, g, b1, b2):
    m[:] = f32(b1) * m + (f32(1) - f32(b1)) * g
    if v is not None:
        v[:] = f32(b2) * v + (f32(1) - f32(b2)) * (g * g)


def ratio(w2, u2, lo, hi):
    if not (w2 > 0 and u2 > 0):
        return 1.0
    return min(max(np.sqrt(w2) / np.sqrt(u2), lo), hi)


def lamb(steps, lr, b1, b2, eps, wd, lo, hi):
    p = init_params(); m = np.zeros(N, f32); v = np.zeros(N, f32)
    for t in range(1, steps + 1):
        moments(m, v, grads(t), b1, b2)
        step = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        _, u = direction(p, m, v, eps, DECAY, wd)
        coef = [ratio(sq(p[a:b]), sq(u[a:b]), lo, hi) for a, b, _ in segs()]
        for (a, b, _), c in zip(segs(), coef):
            p[a:b] -= f32(step * c) * u[a:b]
    return p


def adagrad(steps, lr, eps, wd):
    p = init_params(); v = np.zeros(N, f32)
    for t in range(1, steps + 1):
        g = grads(t) + np.where(DECAY, f32(wd), f32(0)) * p
        v += g * g
        p -= f32(lr) * g / (np.sqrt(v) + f32(eps))
    return p


def lion(steps, lr, b1, b2, wd):
    p = init_params(); m = np.zeros(N, f32)
    for t in range(1, steps + 1):
        g = grads(t)
        c = f32(b1) * m + (f32(1) - f32(b1)) * g
        p[:] = p * np.where(DECAY, f32(1.0 - lr * wd), f32(1)) - f32(lr) * np.sign(c).astype(f32)
        m[:] = f32(b2) * m + (f32(1) - f32(b2)) * g
    return p


def compress(x):
    xb = x.reshape(-1, BLK)
    s = np.sqrt(np.sum(xb.astype(np.float64) ** 2, axis=1) / BLK).astype(f32)
    pos = xb >= 0
    q = np.where(pos, s[:, None], -s[:, None]).astype(f32)
    return pos, s, (xb - q).reshape(-1)


class OneBit:
    def __init__(self, n, ranks):
        unit = ranks * BLK
        self.n, self.R = n, ranks
        self.P = (n + unit - 1) // unit * unit
        self.C = self.P // ranks
        self.we = [np.zeros(self.P, f32) for _ in range(ranks)]
        self.se = [np.zeros(self.C, f32) for _ in range(ranks)]

    def run(self, xs):
        C, R = self.C, self.R
        msgs = []
        for r in range(R):
            y = self.we[r]
            y[:self.n] += xs[r]
            mr = []
            for q in range(R):
                pos, s, err = compress(y[q * C:(q + 1) * C].copy())
                y[q * C:(q + 1) * C] = err
                mr.append((pos, s))
            msgs.append(mr)
        w = f32(1) / f32(R)
        out = np.zeros(self.P, f32)
        for q in range(R):
            z = self.se[q]
            for r in range(R):
                pos, s = msgs[r][q]
                ws = (w * s)[:, None]
                z += np.where(pos, ws, -ws).reshape(-1)
            pos, s, err = compress(z.copy())
            self.se[q] = err
            out[q * C:(q + 1) * C] = np.where(pos, s[:, None], -s[:, None]).reshape(-1)
        return [out[:self.n].copy() for _ in range(R)]


def onebit_adam(steps, lr, b1, b2, eps, wd, freeze, ranks):
    # Every rank: the same p, m, v; warm-up on the ranks' mean gradient, then local momenta 1-bit averaged.
    p = init_params(); m = np.zeros(N, f32); v = np.zeros(N, f32)
    ob = OneBit(N, ranks)
    for t in range(1, steps + 1):
        if t <= freeze:
            g = mean_grad(t, ranks)
            moments(m, v, g, b1, b2)
        else:
            ms = []
            for r in range(ranks):
                mr = m.copy(); moments(mr, None, grads(t, r), b1, b2); ms.append(mr)
            m = ob.run(ms)[0] if ranks > 1 else ms[0]
        _, u = direction(p, m, v, eps, DECAY, wd)
        p -= f32(lr) * u
    return p


def mean_grad(t, ranks):
    # What the trainer's all-reduce gives: the sum of the ranks' g / ranks (each rank's share).
    if ranks == 1:
        return grads(t)
    acc = np.zeros(N, f32)
    for r in range(ranks):
        acc += grads(t, r) * (f32(1) / f32(ranks))
    return acc


def zero_one_adam(steps, lr, b1, b2, eps, wd, var_freeze, var_scaler, local_scaler, local_clipper, ranks=1):
    # Per rank: its own p, m and accumulator u (the local steps make them differ); v is shared.
    R = ranks
    p = [init_params() for _ in range(R)]; m = [np.zeros(N, f32) for _ in range(R)]
    v = np.zeros(N, f32); u = [np.zeros(N, f32) for _ in range(R)]
    ob = OneBit(N, R)
    frozen, vi, vc, li, lc, lrs = False, 1, 0, 1, 0, 0.0
    for t in range(1, steps + 1):
        if not frozen:
            full = t % vi == 0
            if full:
                g = mean_grad(t, R)
                for r in range(R):
                    vr = v.copy()
                    moments(m[r], vr, g, b1, b2)
                v = vr
            else:
                gs = ob.run([grads(t, r) for r in range(R)]) if R > 1 else [grads(t)]
                for r in range(R):
                    moments(m[r], None, gs[r], b1, b2)
            for r in range(R):
                _, d = direction(p[r], m[r], v, eps, DECAY, wd)
                p[r] -= f32(lr) * d
            if t % vi == 0:
                vc += 1
                if vc == var_scaler:
                    vc = 0; vi *= 2
            if t > var_freeze:
                frozen = True
                ob = OneBit(N, R)  # the error buffers start again
            continue
        lrs += lr
        for r in range(R):
            moments(m[r], None, grads(t, r), b1, b2)
            _, d = direction(p[r], m[r], v, eps, DECAY, wd)
            p[r] -= f32(lr) * d
            u[r] -= f32(lr) * d
        if t % li == 0:
            for r in range(R):
                p[r] -= u[r]
                u[r] *= np.sqrt(v) + f32(eps)
            us = ob.run(u) if R > 1 else u
            for r in range(R):
                m[r] = -us[r] * f32(1.0 / lrs)
                p[r] += us[r] / (np.sqrt(v) + f32(eps))
                u[r] = np.zeros(N, f32)
            lrs = 0.0
        lc += 1
        if lc == local_scaler:
            lc = 0; li = min(local_clipper, li * 2)
    return p[0]


def onebit_lamb(steps, lr, b1, b2, eps, wd, freeze, lo, hi, cb, fmax, fmin, fth, ranks=1):
    p = init_params(); m = np.zeros(N, f32); v = np.zeros(N, f32); vf = np.zeros(N, f32)
    ob = OneBit(N, ranks)
    K = len(LAYOUT)
    lcf = [0.0] * K; last = [1.0] * K; scale = None
    for t in range(1, steps + 1):
        g = mean_grad(t, ranks)
        if t <= freeze:
            moments(m, v, g, b1, b2)
            if t == freeze:
                vf = v.copy()
            _, u = direction(p, m, v, eps, DECAY, wd)
            for k, (a, b, _) in enumerate(segs()):
                c = ratio(sq(p[a:b]), sq(u[a:b]), lo, hi)
                if c != 1.0:
                    lcf[k] = cb * lcf[k] + (1 - cb) * c
                p[a:b] -= f32(lr * c) * u[a:b]
            continue
        if scale is None:
            rms = [np.sqrt(sq(m[a:b]) / (b - a)) for a, b, _ in segs()]
            united = sum(rms) / K
            scale = [united / x if x > 0 else 1.0 for x in rms]
        last_m = m.copy()
        ms = []
        for r in range(ranks):
            mr = m.copy()
            moments(mr, None, grads(t, r), b1, b2)
            for k, (a, b, _) in enumerate(segs()):
                mr[a:b] *= f32(scale[k])
            ms.append(mr)
        m = ob.run(ms)[0] if ranks > 1 else ms[0]
        for k, (a, b, _) in enumerate(segs()):
            m[a:b] *= f32(1.0 / scale[k])
        gr = (m - last_m * f32(b1)) / (f32(1) - f32(b1))
        vf = f32(b2) * vf + (f32(1) - f32(b2)) * gr * gr
        q, u = direction(p, m, v, eps, DECAY, wd)
        for k, (a, b, d) in enumerate(segs()):
            factor = float(np.max((np.sqrt(v[a:b]) + f32(eps)).astype(np.float64) /
                                  (np.sqrt(vf[a:b]) + f32(eps)).astype(np.float64)))
            if d and wd > 0 and sq(u[a:b]) > 0:
                ur = min(1.0, np.sqrt(sq(q[a:b])) / np.sqrt(sq(u[a:b])))
                factor = factor * ur + (1 - ur)
            factor = min(max(factor, fmin), fmax)
            factor = min(max(factor, last[k] * (1 - fth)), last[k] * (1 + fth))
            last[k] = factor
            p[a:b] -= f32(lr * lcf[k] * factor) * u[a:b]
    return p


def digest(name, p):
    vals = ", ".join(repr(float(p[i])) for i in PICK)
    print(f'{{"{name}", {float(np.sum(p.astype(np.float64)))!r}, {sq(p)!r}, {{{vals}}}}},')


def main():
    digest("Lamb", lamb(20, 0.01, 0.9, 0.999, 1e-8, 0.01, 0.01, 10.0))
    digest("Adagrad", adagrad(20, 0.01, 1e-10, 0.01))
    digest("Lion", lion(20, 0.001, 0.9, 0.99, 0.1))
    digest("OneBitAdam", onebit_adam(20, 0.001, 0.9, 0.999, 1e-8, 0.01, 5, 1))
    digest("ZeroOneAdam", zero_one_adam(20, 0.001, 0.9, 0.999, 1e-8, 0.01, 8, 2, 3, 4))
    digest("OneBitLamb", onebit_lamb(20, 0.01, 0.9, 0.999, 1e-8, 0.01, 6, 0.01, 10.0, 0.9, 4.0, 0.5, 0.1))
    digest("OneBitAdam dp2", onebit_adam(20, 0.001, 0.9, 0.999, 1e-8, 0.01, 5, 2))
    digest("OneBitAdam dp4", onebit_adam(20, 0.001, 0.9, 0.999, 1e-8, 0.01, 5, 4))
    for R in (2, 4):
        digest(f"ZeroOneAdam dp{R}", zero_one_adam(20, 0.001, 0.9, 0.999, 1e-8, 0.01, 8, 2, 3, 4, R))
        digest(f"OneBitLamb dp{R}", onebit_lamb(20, 0.01, 0.9, 0.999, 1e-8, 0.01, 6, 0.01, 10.0, 0.9, 4.0, 0.5, 0.1, R))
    # The compressed all-reduce alone: 3 rounds of distinct inputs on 2 and 4 ranks.
    for R in (2, 4):
        ob = OneBit(N, R)
        for rnd in range(3):
            out = ob.run([grads(rnd + 1, r) for r in range(R)])[0]
        digest(f"allreduce{R}", out)
        digest(f"worker_error{R}", ob.we[R - 1][:N])


main()
