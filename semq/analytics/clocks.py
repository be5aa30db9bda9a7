"""Clock offsets between the parties, from causality alone (pure Python).

Every party stamps its events with its own clock (docs/events.md), and the
organizations' clocks are not ours to trust. What we do know is causal order:
the platform cannot receive a DATA frame before the origin sent it, the origin
cannot get ACK_FWD before the platform forwarded, and so on. For an event at
logger X that caused an event at logger Y::

    ts_Y - ts_X = delay + (off_Y - off_X)      with delay >= 0

so every such pair bounds ``off_Y - off_X`` from above by ``ts_Y - ts_X``, and
the smallest observed difference is the tightest bound. Traffic in both
directions gives an interval; its midpoint is our estimate (what NTP does with
its minimum-delay samples, assuming the fastest trips are about as fast both
ways), and half its width is the uncertainty. With traffic in one direction
only we take the offset nearest 0 that the bound allows: no correction unless
the logs prove one.

Offsets are relative to one reference clock, the platform with the most
samples (the hub every message passes), and reach other parties through a
spanning tree that prefers the tightest intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClockOffset", "OrderBound", "estimate_offsets"]


@dataclass(frozen=True, slots=True)
class OrderBound:
    """`earlier` logged something that caused an event `later` logged.

    ``min_delta_ms`` is the smallest ``ts_later - ts_earlier`` seen over
    ``samples`` messages.
    """

    earlier: str
    later: str
    min_delta_ms: int
    samples: int


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """One logger's clock minus the reference clock, as estimated.

    ``method`` is ``reference``, ``two-sided`` (bounds from both directions),
    ``one-sided`` (one direction only: nearest 0 within the bound),
    ``inconsistent`` (the bounds cross, e.g. a clock was stepped during the
    window: midpoint anyway) or ``unknown`` (no traffic with a party of known
    offset: assumed 0).
    """

    logger: str
    reference: str
    offset_ms: int
    low_ms: int | None
    high_ms: int | None
    samples: int
    method: str
    via: str | None = None


def estimate_offsets(bounds: list[OrderBound], loggers: set[str] | None = None) -> dict[str, ClockOffset]:
    """Estimate every logger's offset from the reference clock.

    `loggers` adds parties that have no bounds (they get ``unknown``). The
    result has one entry per logger named in `bounds` or `loggers`.
    """
    # upper[(a, b)] bounds off_b - off_a from above.
    upper: dict[tuple[str, str], tuple[int, int]] = {}
    everyone: set[str] = set(loggers or ())
    for bound in bounds:
        everyone.update((bound.earlier, bound.later))
        if bound.earlier == bound.later:
            continue  # same clock: nothing to learn
        key = (bound.earlier, bound.later)
        if key in upper:
            old, n = upper[key]
            upper[key] = (min(old, bound.min_delta_ms), n + bound.samples)
        else:
            upper[key] = (bound.min_delta_ms, bound.samples)
    if not everyone:
        return {}
    weight: dict[str, int] = dict.fromkeys(everyone, 0)
    for (a, b), (_, n) in upper.items():
        weight[a] += n
        weight[b] += n
    platforms = [lg for lg in everyone if lg.startswith("platform:")]
    ref = max(platforms or everyone, key=lambda lg: (weight[lg], lg))

    result: dict[str, ClockOffset] = {
        ref: ClockOffset(ref, ref, 0, 0, 0, weight[ref], "reference")
    }

    def edge(a: str, b: str) -> tuple[int | None, int | None, int]:
        """Interval for off_b - off_a and the samples behind it."""
        hi = upper.get((a, b))
        lo = upper.get((b, a))
        return (
            -lo[0] if lo else None,
            hi[0] if hi else None,
            (hi[1] if hi else 0) + (lo[1] if lo else 0),
        )

    while True:
        best: tuple[tuple[int, int, int], str, str] | None = None
        for a in result:
            for b in everyone - result.keys():
                lo, hi, n = edge(a, b)
                if lo is None and hi is None:
                    continue
                two = lo is not None and hi is not None
                width = (hi - lo) if (two and lo is not None and hi is not None) else 1 << 62
                # Rank: two-sided before one-sided, then narrow, then many samples.
                rank = (0 if two else 1, width, -n)
                if best is None or rank < best[0]:
                    best = (rank, a, b)
        if best is None:
            break
        _, a, b = best
        lo, hi, n = edge(a, b)
        base = result[a].offset_ms
        if lo is not None and hi is not None:
            delta = (lo + hi) // 2 if (lo + hi) >= 0 else -((-(lo + hi)) // 2)
            method = "two-sided" if lo <= hi else "inconsistent"
        elif hi is not None:
            delta, method = min(0, hi), "one-sided"
        else:
            assert lo is not None
            delta, method = max(0, lo), "one-sided"
        result[b] = ClockOffset(
            b, ref, base + delta,
            None if lo is None else base + lo,
            None if hi is None else base + hi,
            n, method, via=a if a != ref else None,
        )
    for lg in everyone - result.keys():
        result[lg] = ClockOffset(lg, ref, 0, None, None, 0, "unknown")
    return result
