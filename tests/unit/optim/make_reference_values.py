#!/usr/bin/python3
# Prints the reference values stored in tests/unit/optim/*_test.cpp. Run with Debian's
# /usr/bin/python3 (python3-torch 1.13 for the AdamW part):
#   /usr/bin/python3 tests/unit/optim/make_reference_values.py
# AdamW: torch.optim.AdamW / torch.optim.Adam themselves. LR schedules and the loss scaler: the
# formulas of deepspeed/runtime/lr_schedules.py and DynamicLossScaler.update_scale
# (deepspeed/runtime/fp16/loss_scaler.py), restated here without DeepSpeed installed.
import math
def warm_gamma(i, W, typ):
    return (1.0/math.log(W))*math.log(i+1) if typ=='log' else i/W
def warmup_lr(i, mn, mx, W, typ):
    W=max(2,W)
    if i<0: return mn
    g = warm_gamma(i,W,typ) if i<W else 1.0
    return mn + ((mx-mn)*g)
def warmup_decay_lr(i, total, mn, mx, W, typ):
    W=max(2,W)
    if i<0: return mn
    if i<W: g=warm_gamma(i,W,typ)
    else: g=max(0.0, float(total-i)/float(max(1.0,total-W)))
    return mn + ((mx-mn)*g)
def warmup_cos_lr(i, lr, total, wmr, W, cmr, typ):
    W=max(2,W)
    if i<0: return 0.0
    if i<W:
        r=warm_gamma(i,W,typ); r = wmr + r*(1.-wmr); return lr*r
    rl=i-W+1; rt=max(1,total-W); p=min(1.0, rl/rt)
    r=(1+math.cos(math.pi*p))/2; r=max(0.0, cmr+(1.-cmr)*r); return lr*r


def schedules():
    its = [-1, 0, 1, 5, 9, 10, 11, 30, 49, 50, 59, 100]
    for typ in ['log', 'linear']:
        print("WarmupLR", typ, [repr(warmup_lr(i, 1e-5, 1e-3, 10, typ)) for i in its])
        print("WarmupDecayLR", typ, [repr(warmup_decay_lr(i, 50, 1e-5, 1e-3, 10, typ)) for i in its])
        print("WarmupCosineLR", typ, [repr(warmup_cos_lr(i, 6e-4, 50, 0.1, 10, 0.01, typ)) for i in its])


class S:
    def __init__(s, init, window, mn, delayed, consec):
        s.cur_scale=init; s.cur_iter=0; s.last=-1; s.window=window; s.min=mn
        s.delayed=delayed; s.hyst=delayed; s.consec=consec
    def update(s, overflow):
        if overflow:
            if s.delayed==1 or s.hyst==1:
                if s.cur_scale==s.min: raise Exception("min")
                s.cur_scale=max(s.cur_scale/2.0, s.min)
            else:
                s.hyst-=1
            s.last=s.cur_iter
        else:
            if s.consec: s.hyst=s.delayed
            st=(s.cur_iter-s.last)-1
            if st>0 and st%s.window==0:
                if not s.consec: s.hyst=s.delayed
                s.cur_scale*=2.0
        s.cur_iter+=1


def scaler():
    pat = "FFFFTFTTFFFFFFTFTFTTTTT"
    for consec in [False, True]:
        s = S(16.0, 3, 1.0, 2, consec)
        out = []
        for c in pat:
            try:
                s.update(c == 'T')
                out.append((s.cur_scale, s.hyst))
            except Exception:
                out.append('raise')
                break
        print("consecutive_hysteresis", consec, out)


def adamw():
    import torch
    torch.set_printoptions(precision=10)
    def run(opt_cls, wd, lrs, p0, grads, **kw):
        p = torch.nn.Parameter(torch.tensor(p0, dtype=torch.float32))
        opt = opt_cls([p], lr=lrs[0], betas=(0.9, 0.95), eps=1e-8, weight_decay=wd, **kw)
        out = []
        for lr, g in zip(lrs, grads):
            for grp in opt.param_groups: grp['lr'] = lr
            p.grad = torch.tensor(g, dtype=torch.float32)
            opt.step()
            st = opt.state[p]
            out.append((p.detach().clone(), st['exp_avg'].clone(), st['exp_avg_sq'].clone()))
        return out
    p0 = [0.5, -1.25, 2.0, 0.0, -0.03125, 3.5]
    grads = [[0.1, -0.2, 0.3, -0.4, 0.5, 1e-3],
             [-0.05, 0.25, 0.0, 1.5, -2.0, 4e-3],
             [0.2, 0.2, -0.1, 0.0, 0.75, -0.5]]
    lrs = [1e-2, 6e-3, 3e-3]
    for name, cls, wd in [("adamw_wd0.1", torch.optim.AdamW, 0.1), ("adamw_wd0", torch.optim.AdamW, 0.0), ("adam_l2_wd0.1", torch.optim.Adam, 0.1)]:
        res = run(cls, wd, lrs, p0, grads)
        print(name)
        for i, (p, m, v) in enumerate(res):
            print(" step", i+1, "p", ", ".join("%.9ef" % x for x in p.tolist()))
        p, m, v = res[-1]
        print(" m", ", ".join("%.9ef" % x for x in m.tolist()))
        print(" v", ", ".join("%.9ef" % x for x in v.tolist()))
    print(torch.__version__)


if __name__ == "__main__":
    schedules()
    scaler()
    adamw()
