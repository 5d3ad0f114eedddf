"""Microbenchmarks of the candidate ops for issue #11 at n16-1b shapes (bf16, one GPU).

Usage: python3 scripts/dev/gpu/bench_ops.py [--batch 32]

Each line: forward+backward ms (median of 50, CUDA events) of one way to compute
the same thing, and the max abs difference of its output from the first way.
- LM self-attention (B, 12 q / 4 kv heads of 128, S = 64 image + 32 text tokens):
  dense (B,1,S,S) mask + repeat_interleave K/V (today) vs is_causal + enable_gqa.
- DiT cross-attention to the VL tokens with a key-padding mask vs none.
- Per-embodiment linear (7 layers' shapes): W[ids] gather + bmm (today) vs one
  grouped GEMM over tokens sorted by id (torch._grouped_mm) at 1, 4, 32 ids.
- RMSNorm written out (today) vs F.rms_norm.
"""
import argparse

import torch
import torch.nn.functional as F
from cuda_timing import median_ms  # noqa: E402 -- scripts/dev/gpu/ is the script's own folder


def bench(fn, iters=50):
    return median_ms(fn, iters, warmup=5)


def fb(f, *inputs):
    """forward+backward closure; returns (closure, output of one forward)."""
    def run():
        for x in inputs:
            x.grad = None
        y = f(*inputs)
        y.float().sum().backward()
        return y
    return run, f(*inputs).detach()


def report(name, base, run, out):
    t = bench(run)
    d = (out.float() - base.float()).abs().max().item() if base is not None else 0.0
    print(f"  {name:58s} {t:8.3f} ms   max|diff| {d:.3g}")


def attention(B):
    dev, bf = "cuda", torch.bfloat16
    S, L, hq, hkv, d = 96, 32, 12, 4, 128
    q = torch.randn(B, hq, S, d, device=dev, dtype=bf, requires_grad=True)
    k = torch.randn(B, hkv, S, d, device=dev, dtype=bf, requires_grad=True)
    v = torch.randn(B, hkv, S, d, device=dev, dtype=bf, requires_grad=True)
    lengths = torch.randint(2, L + 1, (B,), device=dev)
    key_mask = torch.cat([torch.ones(B, S - L, dtype=torch.bool, device=dev),
                          torch.arange(L, device=dev)[None] < lengths[:, None]], 1)
    causal = torch.ones(S, S, dtype=torch.bool, device=dev).tril()
    mask = causal[None, None] & key_mask[:, None, None, :]
    valid_q = key_mask[:, None, :, None]   # compare only real query rows

    def dense(q, k, v):
        kk = torch.repeat_interleave(k, hq // hkv, 1)
        vv = torch.repeat_interleave(v, hq // hkv, 1)
        return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask) * valid_q

    def causal_gqa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True) * valid_q
    print(f"LM self-attention B={B} S={S} {hq}q/{hkv}kv x {d}")
    run, base = fb(dense, q, k, v)
    report("dense mask + repeat_interleave (today)", None, run, base)
    run, out = fb(causal_gqa, q, k, v)
    report("is_causal + enable_gqa", base, run, out)

    H, w, h2, dh = 17, 1024, 16, 64
    x = torch.randn(B, h2, H, dh, device=dev, dtype=bf, requires_grad=True)
    ck = torch.randn(B, h2, S, dh, device=dev, dtype=bf, requires_grad=True)
    cv = torch.randn(B, h2, S, dh, device=dev, dtype=bf, requires_grad=True)
    km = key_mask[:, None, None, :]
    print(f"DiT cross-attention B={B} {H} queries -> {S} keys, {h2} x {dh}")
    run, base = fb(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=km), x, ck, cv)
    report("key-padding bool mask (today)", None, run, base)
    run, _ = fb(lambda a, b, c: F.scaled_dot_product_attention(a, b, c), x, ck, cv)
    report("no mask (lower bound, different result)", None, run, base)
    self_x = torch.randn(B, h2, H, dh, device=dev, dtype=bf, requires_grad=True)
    run, base = fb(lambda a: F.scaled_dot_product_attention(a, a, a), self_x)
    report("DiT self-attention 17 tokens", None, run, base)


def category_linear(B):
    dev, bf = "cuda", torch.bfloat16
    E = 32
    # (tokens per sample, in, out) of the 7 per-embodiment layers of n16-1b
    shapes = [(1, 64, 1024), (1, 1024, 1024), (16, 64, 1024), (16, 2048, 1024), (16, 1024, 1024),
              (16, 1024, 1024), (16, 1024, 64)]
    has_grouped = hasattr(torch, "_grouped_mm")
    print(f"per-embodiment linears (7 layers of n16-1b), B={B}, torch._grouped_mm: {has_grouped}")
    for n_ids in (1, 4, 32):
        ids = (torch.arange(B, device=dev) % n_ids)[torch.randperm(B, device=dev)]
        layers = []
        for T, i, o in shapes:
            W = (torch.randn(E, i, o, device=dev) * 0.02).requires_grad_()
            b = torch.zeros(E, o, device=dev, requires_grad=True)
            x = torch.randn(B, T, i, device=dev, requires_grad=True)
            layers.append((x, W, b))

        def gather_bmm():
            out = []
            with torch.autocast("cuda", dtype=bf):
                for x, W, b in layers:
                    out.append(torch.bmm(x, W[ids]) + b[ids].unsqueeze(1))
            return out

        def grouped():
            out = []
            order = torch.argsort(ids)
            counts = torch.zeros(E, dtype=torch.int32, device=dev).scatter_add_(
                0, ids.int(), torch.ones_like(ids, dtype=torch.int32))
            for x, W, b in layers:
                T = x.shape[1]
                xs = x[order].reshape(B * T, -1).to(bf)
                offs = torch.cumsum(counts * T, 0, dtype=torch.int32)
                y = torch._grouped_mm(xs, W.to(bf), offs=offs)
                y = y.view(B, T, -1) + b[ids[order]].unsqueeze(1).to(bf)
                out.append(torch.empty_like(y).index_copy_(0, order, y))
            return out

        def run(f):
            def r():
                for x, W, b in layers:
                    x.grad = W.grad = b.grad = None
                ys = f()
                sum(y.float().sum() for y in ys).backward()
            return r
        base = [y.detach() for y in gather_bmm()]
        print(f"  {n_ids:2d} distinct ids")
        report("  W[ids] gather + bmm (today)", None, run(gather_bmm), base[-1])
        if has_grouped:
            try:
                outs = [y.detach() for y in grouped()]
                d = max((a.float() - b.float()).abs().max().item() for a, b in zip(outs, base))
                t = bench(run(grouped))
                print(f"    {'grouped GEMM over id-sorted tokens':56s} {t:8.3f} ms   max|diff| {d:.3g}")
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"    grouped GEMM failed: {type(e).__name__}: {str(e)[:200]}")


def norms(B):
    dev, bf = "cuda", torch.bfloat16
    x = torch.randn(B, 96, 1536, device=dev, dtype=bf, requires_grad=True)
    w = torch.ones(1536, device=dev, dtype=torch.float32, requires_grad=True)

    def written(x, w):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return w * (x.float() * torch.rsqrt(var + 1e-6)).to(x.dtype)

    print(f"RMSNorm (B, 96, 1536) bf16 input, fp32 weight")
    run, base = fb(written, x, w)
    report("written out (today)", None, run, base)
    run, out = fb(lambda x, w: F.rms_norm(x, (1536,), w, 1e-6), x, w)
    report("F.rms_norm", base, run, out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    B = ap.parse_args().batch
    print(torch.__version__, torch.cuda.get_device_name())
    attention(B)
    category_linear(B)
    norms(B)


if __name__ == "__main__":
    main()
