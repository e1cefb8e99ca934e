"""Throughput figures in the style of tf_cnn_benchmarks, as pure Python (no TensorFlow).

Each rank times its own training steps after `warmup_steps` per epoch and reports images/s;
the per-rank figures are gathered and the total is their measured sum (never rank 0 x N).
Jitter is tf_cnn_benchmarks' robust spread: 1.4826 x the median absolute deviation of the
per-step images/s samples, pooled over ranks.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass


@dataclass
class RankTiming:
    """What one rank measured: images and seconds over its timed steps, per-step durations."""

    images: int
    seconds: float
    step_seconds: list[float]
    batch_size: int

    @property
    def images_per_sec(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class ThroughputSummary:
    images_per_sec: float  # total: sum of the per-worker rates
    images_per_sec_per_worker: list[float]
    images_per_sec_mean: float
    images_per_sec_std: float
    jitter: float
    step_time_ms: float
    timed_steps: int

    def as_dict(self) -> dict:
        return asdict(self)


def jitter(samples: list[float]) -> float:
    """1.4826 x median absolute deviation (tf_cnn_benchmarks' `jitter`)."""
    if not samples:
        return float("nan")
    med = statistics.median(samples)
    return 1.4826 * statistics.median(abs(s - med) for s in samples)


def summarize(ranks: list[RankTiming]) -> ThroughputSummary:
    """Combine every rank's timing: total = sum of measured per-rank rates."""
    per_worker = [r.images_per_sec for r in ranks]
    step_samples = [r.batch_size / s for r in ranks for s in r.step_seconds if s > 0]
    all_steps = [s for r in ranks for s in r.step_seconds]
    return ThroughputSummary(
        images_per_sec=round(sum(per_worker), 3),
        images_per_sec_per_worker=[round(x, 3) for x in per_worker],
        images_per_sec_mean=round(statistics.fmean(per_worker), 3),
        images_per_sec_std=round(statistics.pstdev(per_worker), 3) if len(ranks) > 1 else 0.0,
        jitter=round(jitter(step_samples), 3),
        step_time_ms=round(1000 * statistics.fmean(all_steps), 3) if all_steps else float("nan"),
        timed_steps=min(len(r.step_seconds) for r in ranks),
    )
