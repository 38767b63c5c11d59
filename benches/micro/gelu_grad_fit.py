"""NOTES.md item 146: the coefficients of `fz_gelu_grad` (fuse-macros/src/cuda/text.rs), gelu's
derivative in f32, and its error by a NumPy model of the helper's steps (needs numpy and scipy;
runs on any machine, about a minute).

    g(x) = Phi(x) + x phi(x) = [x > 0] + phi(x) (x - R(|x|))   (x > 0)
                             = phi(x) (x + R(|x|))              (otherwise)

with R(a) = Phi(-a) / phi(a), Mills' ratio, fitted as t Q(t), t = 1 / (1 + a / 4), Q of degree 9
(its Q(0) comes out 1/4, so that R(a) -> 1/a), minimax in relative error by Lawson's iteration,
then the coefficients rounded to f32 from the highest down, refitting the lower ones after each. The
model rounds every step to f32 as the GPU does; `rcp.approx` and `ex2.approx` are modelled as
correctly rounded (the GPU's are within an ulp or two of that)."""
import numpy as np
from scipy.special import erfc, erfcx

f32 = np.float32
P = 0.25
DEG = 9


def mills(a):
    return np.sqrt(np.pi / 2) * erfcx(a / np.sqrt(2))


def fit():
    k = np.arange(6000)
    t = np.concatenate([0.5 * (1 - np.cos(np.pi * (k + 0.5) / 6000)), [1.0]])
    y = mills((1 / t - 1) / P) / t
    c = list(lawson(np.vander(t, DEG + 1, increasing=True), y, y, 300))
    fixed = {}
    for j in range(DEG, -1, -1):
        fixed[j] = float(f32(c[j]))
        if j == 0:
            break
        rest = y - sum(v * t**i for i, v in fixed.items())
        c[:j] = list(lawson(np.vander(t, j, increasing=True), rest, y, 100))
    return [f32(fixed[j]) for j in range(DEG + 1)]


def lawson(V, rest, scale, iters):
    """Minimax of `|V c - rest| / scale` by Lawson's reweighted least squares."""
    w = np.ones(len(rest))
    for _ in range(iters):
        c, *_ = np.linalg.lstsq(V * (w / scale)[:, None], rest * (w / scale), rcond=None)
        e = np.abs(V @ c - rest) / scale
        w = w * e
        w /= w.sum()
    return c


def fma(a, b, c):
    return (np.float64(a) * b + c).astype(f32)


def helper(x, C):
    x = x.astype(f32)
    d = fma(f32(0.25), np.abs(x), f32(1))
    c1, c0 = f32(float.fromhex("-0x1.715476p-2")), f32(float.fromhex("-0x1.53643ap-1"))
    p = fma((x.astype(np.float64) * x).astype(f32), c1, c0)
    t = (1 / d.astype(np.float64)).astype(f32)
    h = np.exp2(p.astype(np.float64)).astype(f32)
    q = np.full_like(x, C[DEG])
    for j in range(DEG - 1, -1, -1):
        q = fma(q, t, C[j])
    r = (t.astype(np.float64) * q).astype(f32)
    e = (h.astype(np.float64) * h).astype(f32)
    pos = x > 0
    s = (x.astype(np.float64) + np.where(pos, -r, r)).astype(f32)
    return fma(e, s, pos.astype(f32))


def written_out(x):
    """0.5 (1 + erff(x / sqrt 2)) + x expf(-x^2 / 2) / sqrt(2 pi), each step rounded."""
    x = x.astype(f32)
    erf_ = (1 - erfc((x.astype(np.float64) * f32(0.70710677)).astype(f32))).astype(f32)
    cdf = fma(erf_, f32(0.5), f32(0.5))
    pdf = np.exp((x.astype(np.float64) * x).astype(f32) * -0.5).astype(f32)
    pdf = (pdf.astype(np.float64) * f32(0.3989423)).astype(f32)
    return (cdf + (x.astype(np.float64) * pdf).astype(f32)).astype(f32)


def exact(x):
    x = x.astype(np.float64)
    return 0.5 * erfc(-x / np.sqrt(2)) + x * np.exp(-x * x / 2) / np.sqrt(2 * np.pi)


if __name__ == "__main__":
    C = fit()
    print("Q's coefficients, t^0 first:", ", ".join(float(c).hex() for c in C))
    rng = np.random.default_rng(7)
    x = np.concatenate([np.linspace(-15, 15, 3_000_001), rng.normal(0, 3, 2_000_000)]).astype(f32)
    g = exact(x)
    ulp = np.spacing(np.abs(g).astype(f32)).astype(np.float64)
    away = np.abs(x + 0.75) > 0.1
    for name, f in [("fz_gelu_grad", lambda v: helper(v, C)), ("written out", written_out)]:
        err = np.abs(f(x).astype(np.float64) - g)
        ulps = err / ulp
        print(f"{name}: at most {err.max():.2e} absolute; ulps of the value away from the zero "
              f"near -0.75: {ulps[away & (x >= -2)].max():.0f} from -2 up, "
              f"{ulps[(x < -2) & (x >= -6)].max():.0f} on [-6, -2), "
              f"{ulps[x < -6].max():.0f} below -6")
