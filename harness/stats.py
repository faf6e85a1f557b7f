"""Sample statistics and the "real vs within noise" verdict.

Data flow: a child process returns raw per-step times (milliseconds); the parent turns them into a
`SampleStats` with `summarize`, and compares two configurations (or one configuration across two
runs, in the gate) with `compare` / `verdict`, which yield a `Verdict` (ratio, noise, "real" or
"within noise"). Nothing here knows about JAX or files: it is plain numpy over lists of floats.

The rules follow the reference engine's revalidation (../shared/reference/seed-engine-notes.md
§3.2), so our numbers can be read against its table:

- IQR uses the reference's index rule on the *sorted* samples: ``q1 = s[n // 4]`` and
  ``q3 = s[(3 * n) // 4]`` (no interpolation). For n = 15 that is s[3] and s[11]. It is slightly
  wider than numpy's interpolated quartiles for small n, which errs on the side of calling things
  noise.
- Relative IQR = IQR / median.
- A difference is **real** only when ``|ratio - 1| > 2 * noise``, where ``ratio = a / b`` of the two
  medians and ``noise`` is the *larger* of the two relative IQRs. Anything else is "within noise".
  We report the ratio and the verdict, never a bare "faster".

`bootstrap_ci` gives a seeded percentile-bootstrap confidence interval for any statistic (median
by default); it is reported beside the IQR, not used by the verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

REAL = "real"
WITHIN_NOISE = "within noise"


@dataclass(frozen=True)
class SampleStats:
    """Summary of one set of samples (units are those of the samples, e.g. milliseconds).

    `rel_iqr` is a fraction (0.01 = 1%), `iqr = q3 - q1` with the index rule described in the
    module docstring.
    """

    n: int
    median: float
    min: float
    max: float
    q1: float
    q3: float
    iqr: float
    rel_iqr: float
    mean: float

    @property
    def rel_iqr_pct(self) -> float:
        """Relative IQR in percent."""
        return 100.0 * self.rel_iqr


@dataclass(frozen=True)
class Verdict:
    """The comparison of two medians: `ratio = a / b`, `noise` the larger relative IQR (fraction).

    `real` is True only when ``|ratio - 1| > 2 * noise``; `label` is "real" or "within noise".
    """

    ratio: float
    noise: float
    real: bool

    @property
    def label(self) -> str:
        """ "real" or "within noise"."""
        return REAL if self.real else WITHIN_NOISE

    @property
    def threshold(self) -> float:
        """The smallest |ratio - 1| that would count as real (2 × noise)."""
        return 2.0 * self.noise


def _sorted_finite(samples: Sequence[float] | np.ndarray) -> np.ndarray:
    """Samples as a sorted float64 array; rejects empty input and NaN/inf (a broken timer)."""
    arr = np.asarray(samples, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"need a non-empty 1-D list of samples, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("samples contain NaN or inf")
    return np.sort(arr)


def iqr_bounds(samples: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """(q1, q3) = (s[n // 4], s[3n // 4]) of the sorted samples (the reference's rule)."""
    s = _sorted_finite(samples)
    n = s.size
    return float(s[n // 4]), float(s[(3 * n) // 4])


def summarize(samples: Sequence[float]) -> SampleStats:
    """Median, min, max, IQR (index rule), relative IQR and mean of `samples`.

    The median is numpy's (the middle sample for odd n, the mean of the two middle ones for even
    n). A median of zero gives an infinite relative IQR rather than a division error.
    """
    s = _sorted_finite(samples)
    q1, q3 = iqr_bounds(s)
    median = float(np.median(s))
    iqr = q3 - q1
    rel = iqr / median if median != 0 else math.inf
    return SampleStats(
        n=int(s.size),
        median=median,
        min=float(s[0]),
        max=float(s[-1]),
        q1=q1,
        q3=q3,
        iqr=iqr,
        rel_iqr=rel,
        mean=float(np.mean(s)),
    )


def verdict(ratio: float, noise: float) -> Verdict:
    """Judge a ratio against a noise level (fraction): real iff |ratio - 1| > 2·noise."""
    if not math.isfinite(ratio) or ratio <= 0:
        raise ValueError(f"ratio must be a positive finite number, got {ratio}")
    if noise < 0 or math.isnan(noise):
        raise ValueError(f"noise must be >= 0, got {noise}")
    return Verdict(ratio=float(ratio), noise=float(noise), real=abs(ratio - 1.0) > 2.0 * noise)


def compare(a: SampleStats, b: SampleStats) -> Verdict:
    """Verdict on median(a) / median(b) with noise = max(rel IQR of a, rel IQR of b)."""
    if b.median == 0:
        raise ValueError("cannot form a ratio against a zero median")
    return verdict(a.median / b.median, max(a.rel_iqr, b.rel_iqr))


def bootstrap_ci(
    samples: Sequence[float] | np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray] | None = None,
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of `statistic` (default: the median).

    Resamples with replacement `n_resamples` times from a `numpy.random.default_rng(seed)`
    generator, so the interval is reproducible. `statistic` receives a 2-D array
    (resamples × n) and must reduce along axis 1 (e.g. ``lambda x: np.mean(x, axis=1)``).
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    s = _sorted_finite(samples)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, s.size, size=(n_resamples, s.size))
    resamples = s[idx]  # [n_resamples, n]
    stat = statistic if statistic is not None else (lambda x: np.median(x, axis=1))
    values = np.asarray(stat(resamples), dtype=np.float64)
    if values.shape != (n_resamples,):
        raise ValueError(f"statistic must reduce axis 1 to shape ({n_resamples},), got {values.shape}")
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
    return float(lo), float(hi)
