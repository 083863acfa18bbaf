"""Money in integer micro-dollars: one rule for what a piece of GPU time costs, wherever it is summed.

A report over etcd's intervals (summed in Python) and over archived ones (summed in SQL) must give
the same figures digit by digit whichever store holds an interval. Float sums of GPU-seconds x a
price such as $2.49 (not a binary fraction) round differently in each order of addition, so the
figures drifted in the last digit when the archiver moved an interval. Here a cost is rounded once,
to a whole micro-dollar, per piece of an interval within one UTC day (clipped to the window asked
for), by `piece_micro_usd`; every sum after that adds integers, which is exact in any order on
both SQL backends and in numpy's float64 (exact for integers below 2**53 micro-dollars, $9 billion).

The SQL store keeps each interval-day's cost (`history_usage_days.cost_micro_usd`, migration 0005),
computed here when the interval is archived; a piece clipped by a window that cuts a day is computed
here too, from the day row's own start and end, never in SQL. FOCUS and the API show dollars as
decimal strings (`format_usd`), as FOCUS's cost columns are decimals.
"""

from __future__ import annotations

from collections.abc import Iterator

MICRO_PER_USD = 1_000_000
DAY_S = 86_400.0


def micro_per_gpu_hour(usd_per_gpu_hour: float) -> int:
    """The price in whole micro-dollars per GPU-hour (prices are given to the cent or so)."""
    return round(usd_per_gpu_hour * MICRO_PER_USD)


def piece_micro_usd(gpu_count: int, start_s: float, end_s: float, usd_per_gpu_hour: float) -> int:
    """What `gpu_count` GPUs held from `start_s` to `end_s` (inside one UTC day) cost, in whole
    micro-dollars, rounded half to even. numpy's side (`report.columns.split`) computes
    `rint(gpus x (end - start) x price_micro / 3600)` in the same order of operations, so both give
    the same integer from the same floats."""
    if end_s <= start_s:
        return 0
    return round(float(gpu_count) * (end_s - start_s) * float(micro_per_gpu_hour(usd_per_gpu_hour)) / 3600.0)


def day_pieces(start_s: float, end_s: float) -> Iterator[tuple[float, float]]:
    """[start, end) cut at each UTC midnight (the same cut as the history's day rows)."""
    at = start_s
    while at < end_s:
        midnight = (at // DAY_S + 1) * DAY_S
        piece_end = min(end_s, midnight)
        yield at, piece_end
        at = piece_end


def span_micro_usd(gpu_count: int, start_s: float, end_s: float, usd_per_gpu_hour: float) -> int:
    """The cost of [start_s, end_s): the sum of its day pieces' costs, as every report counts it."""
    return sum(piece_micro_usd(gpu_count, a, b, usd_per_gpu_hour) for a, b in day_pieces(start_s, end_s))


def usd(micro: int) -> float:
    """Dollars as a float, for charts and JSON numbers: the same integer always gives the same float."""
    return micro / MICRO_PER_USD


def format_usd(micro: int, *, places: int = 6) -> str:
    """Dollars as an exact decimal string: '12.345678' (places=6) or '12.35' (places=2, half to even)."""
    sign = "-" if micro < 0 else ""
    micro = abs(micro)
    if places < 6:
        step = 10 ** (6 - places)
        q, r = divmod(micro, step)
        # Half to even, on integers: no float in the way.
        if r * 2 > step or (r * 2 == step and q % 2 == 1):
            q += 1
        micro, scale = q, 10**places
    else:
        scale = MICRO_PER_USD
    whole, frac = divmod(micro, scale)
    return f"{sign}{whole}.{frac:0{places}d}" if places else f"{sign}{whole}"


def micro_usd_of(text: str) -> int:
    """'12.345678' (as `format_usd` writes it, or fewer places) -> 12345678; a clear error otherwise."""
    whole, _, frac = text.strip().partition(".")
    sign = -1 if whole.startswith("-") else 1
    whole = whole.lstrip("-")
    if not whole.isdigit() or (frac and not frac.isdigit()) or len(frac) > 6:
        raise ValueError(f"not a dollar amount with at most six decimal places: {text!r}")
    return sign * (int(whole) * MICRO_PER_USD + int(frac.ljust(6, "0") or "0"))
