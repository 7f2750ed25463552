"""Train statistics before the GEMM (issue 16, item 3), studied before it is built: how accurate
are the column statistics of a = x W^T when taken from x's mean and centred covariance
(mean_a = W xbar, var_a[n] = w_n^T S w_n, all fp32), against float64, beside today's statistics
of the GEMM's fp32 output? A CPU simulation (numpy), no GPU:

    python3 bench/stats_before_gemm_study.py

It prints a markdown table (docs/performance.md holds its output and what it implies). The GEMM's
fp32 accumulators are modelled as the exact product rounded once, which flatters today's
schedule; x and W are rounded to bf16 first, as a bf16 layer's are."""
import numpy as np

f32 = np.float32
def bf16(a):  # round to nearest even bf16, kept in float32
    a = np.asarray(a, dtype=np.float32)
    u = a.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)

def tile_stats_fp32(a, bm=128):
    """Today's schedule: per row tile (count, mean, M2) in fp32, merged with Chan's formula."""
    n, mean, m2 = 0, np.zeros(a.shape[1], f32), np.zeros(a.shape[1], f32)
    for r in range(0, a.shape[0], bm):
        t = a[r:r + bm]
        nb = f32(t.shape[0]); mb = t.mean(0, dtype=f32)
        m2b = ((t - mb) ** 2).sum(0, dtype=f32)
        if n == 0:
            n, mean, m2 = nb, mb, m2b; continue
        tot = f32(n + nb); d = mb - mean
        mean = mean + d * (nb / tot)
        m2 = m2 + m2b + d * d * (f32(n) * nb / tot)
        n = tot
    return mean, m2 / f32(n)

def cov_stats_fp32(x, w, bm=128):
    """Item 3: xbar and centred S (K x K) per row tile in fp32, Chan's merge for a covariance;
    then mean_a = W xbar, var_a = diag(W S W^T), all fp32."""
    n, mean, c = 0, None, None
    for r in range(0, x.shape[0], bm):
        t = x[r:r + bm]
        nb = f32(t.shape[0]); mb = t.mean(0, dtype=f32)
        tc = (t - mb).astype(f32)
        cb = (tc.T @ tc).astype(f32)
        if n == 0:
            n, mean, c = nb, mb, cb; continue
        tot = f32(n + nb); d = (mb - mean).astype(f32)
        mean = mean + d * (nb / tot)
        c = c + cb + np.outer(d, d).astype(f32) * (f32(n) * nb / tot)
        n = tot
    s = (c / f32(n)).astype(f32)
    mean_a = (w @ mean).astype(f32)
    var_a = np.einsum('nk,kj,nj->n', w, s, w, dtype=f32)
    # How much the quadratic form cancels: |w|^T |S| |w| / w^T S w (1 = no cancellation).
    cond = np.einsum('nk,kj,nj->n', np.abs(w), np.abs(s), np.abs(w)) / np.maximum(var_a, 1e-30)
    return mean_a, var_a, cond

def shifted_stats_fp32(x, w, shift_rows=64, cta_rows=256):
    """Item 3 as kernels/input_stats.cuh builds it for 16-bit x: a shift from the first
    shift_rows rows (the column mean rounded to bf16 where it exceeds eight standard deviations,
    else 0), d = x - shift; per block of cta_rows rows the sums of d and d^T d in fp32, then added
    over the blocks (the kernel's sums run per warp over strided 16-row slabs, then over warps
    and CTAs); S = sum d d^T / M - dbar dbar^T. The factor counts the shift's subtraction too:
    |w|^T (|sum d d^T / M| + |dbar dbar^T|) |w| / w^T S w."""
    head = x[:shift_rows]
    mean = head.mean(0, dtype=f32)
    var = np.maximum((head * head).mean(0, dtype=f32) - mean * mean, 0)
    shift = np.where(mean * mean > 64 * var, bf16(mean), f32(0)).astype(f32)
    sd, sdd = np.zeros(x.shape[1], f32), np.zeros((x.shape[1], x.shape[1]), f32)
    for r in range(0, x.shape[0], cta_rows):
        d = (x[r:r + cta_rows] - shift).astype(f32)
        sd = (sd + d.sum(0, dtype=f32)).astype(f32)
        sdd = (sdd + (d.T @ d).astype(f32)).astype(f32)
    m = f32(x.shape[0])
    dbar = (sd / m).astype(f32)
    r2 = (sdd / m).astype(f32)
    dd = np.outer(dbar, dbar).astype(f32)
    s = (r2 - dd).astype(f32)
    mean_a = (w @ (shift + dbar).astype(f32)).astype(f32)
    var_a = np.einsum('nk,kj,nj->n', w, s, w, dtype=f32)
    bound = np.einsum('nk,kj,nj->n', np.abs(w), np.abs(r2) + np.abs(dd), np.abs(w))
    return mean_a, var_a, bound / np.maximum(var_a, 1e-30)

def y_error(x, w, mean, var, eps=1e-5):
    """Relative error (norm-wise, as the sweep compares) of y = (a - mean)/sqrt(var + eps) when
    the statistics are the given ones instead of float64's; a is float64 for both."""
    a = x.astype(np.float64) @ w.astype(np.float64).T
    m64 = a.mean(0); v64 = a.var(0)
    ref = (a - m64) / np.sqrt(v64 + eps)
    got = (a - mean.astype(np.float64)) / np.sqrt(var.astype(np.float64) + eps)
    return np.linalg.norm(got - ref) / np.linalg.norm(ref), np.max(np.abs(var / v64 - 1))

rng = np.random.default_rng(7)
def case(name, x, w):
    x = bf16(x); w = bf16(w)
    a32 = (x @ w.T).astype(f32)  # the GEMM's fp32 accumulators (rounded once: optimistic)
    m1, v1 = tile_stats_fp32(a32)
    m2, v2, cond = cov_stats_fp32(x, w)
    e1, r1 = y_error(x, w, m1, v1)
    e2, r2 = y_error(x, w, m2, v2)
    m3, v3, cond3 = shifted_stats_fp32(x, w)
    e3, r3 = y_error(x, w, m3, v3)
    print(f"| {name} | {e1:.2e} | {r1:.2e} | {e2:.2e} | {r2:.2e} | {np.max(cond):.1e} "
          f"| {e3:.2e} | {r3:.2e} | {np.max(cond3):.1e} |")

print("| case | today: y error | today: max rel. var error | item 3: y error | item 3: max rel. var error | max cancellation "
      "| shifted: y error | shifted: max rel. var error | shifted: max factor |")
print("|---|---|---|---|---|---|---|---|---|")
M, N, K = 8192, 64, 64
case("U[0,1) x and W", rng.random((M, K)), rng.random((N, K)) - 0.5)
case("x ~ 1000 + N(0,1)", 1000 + rng.standard_normal((M, K)), rng.standard_normal((N, K)))
case("K = 1", rng.random((M, 1)), rng.standard_normal((N, 1)))
# Correlated features: x1 = x0 + 1e-2 noise; w = (1, -1, 0...) makes a column of a the noise.
x = rng.standard_normal((M, K)); x[:, 1] = x[:, 0] + 1e-2 * rng.standard_normal(M)
w = rng.standard_normal((N, K)) * 1e-3; w[:, 0] = 1; w[:, 1] = -1
case("a = x0 - x1, x1 = x0 + 1e-2 noise", x, w)
x = rng.standard_normal((M, K)); x[:, 1] = x[:, 0] + 1e-3 * rng.standard_normal(M)
case("a = x0 - x1, x1 = x0 + 1e-3 noise", x, w)
x = 100 + rng.standard_normal((M, K)); x[:, 1] = x[:, 0] + 1e-2 * rng.standard_normal(M)
case("same, x ~ 100 + N(0,1), 1e-2 noise", x, w)
# Low-rank x (features from a narrow layer): K = 64 columns spanning 4 directions.
x = rng.standard_normal((M, 4)) @ rng.standard_normal((4, K)) + 1e-3 * rng.standard_normal((M, K))
case("rank-4 x + 1e-3 noise, random W", x, rng.standard_normal((N, K)))
