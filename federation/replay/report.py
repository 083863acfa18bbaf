"""Writing a sweep's results: a Markdown table, a CSV, the headline figures and one plot per size.

The headline compares gpufed with the fixed-wait curve, not with bursting at once: at each private
size, the fixed-wait policies (burst-now is the wait of 0) trace cloud cost against average JCT, and
`cost_ratio_vs_fixed_wait_curve` is gpufed's cost over the curve's cost at gpufed's average JCT,
interpolated linearly between the curve's points sorted by JCT. Outside the curve's JCT range the
nearest end is used, and the figure says it was clamped.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from federation.replay.metrics import Metrics

# Per-job lists stay out of the tables.
_COLUMNS = [f.name for f in fields(Metrics) if f.name != "missed_deadline_ids"]


@dataclass(frozen=True, slots=True)
class Headline:
    size_factor: float
    gpufed_cost_usd: float
    gpufed_avg_jct_h: float
    curve_cost_usd: float
    # gpufed's JCT lies outside the curve's range (the curve's end was used).
    clamped: bool
    burst_now_cost_usd: float
    burst_now_avg_jct_h: float = 0.0
    week: str = ""
    # The spot-aware yardstick (`policies.spot_curve`): the curve and burst-now with gpufed's spot rule.
    spot_curve_cost_usd: float | None = None
    spot_clamped: bool = False
    spot_burst_now_cost_usd: float | None = None
    # Deadlines (`jobs.deadlines`): jobs with one, gpufed's misses, burst-now's, and the jobs gpufed
    # missed that burst-now met (the count that must be 0).
    deadlines: int = 0
    deadlines_missed: int = 0
    burst_now_deadlines_missed: int = 0
    missed_by_gpufed_met_by_burst_now: int = 0

    @property
    def cost_ratio_vs_fixed_wait_curve(self) -> float:
        return _ratio(self.gpufed_cost_usd, self.curve_cost_usd)

    @property
    def cloud_cost_cut_vs_burst_now(self) -> float:
        return _cut(self.gpufed_cost_usd, self.burst_now_cost_usd)

    @property
    def cost_ratio_vs_spot_fixed_wait_curve(self) -> float | None:
        if self.spot_curve_cost_usd is None:
            return None
        return _ratio(self.gpufed_cost_usd, self.spot_curve_cost_usd)

    @property
    def cloud_cost_cut_vs_spot_burst_now(self) -> float | None:
        if self.spot_burst_now_cost_usd is None:
            return None
        return _cut(self.gpufed_cost_usd, self.spot_burst_now_cost_usd)

    @property
    def avg_jct_vs_burst_now(self) -> float:
        """How much longer gpufed's average JCT is than burst-now's (0.06: 6 % longer)."""
        if self.burst_now_avg_jct_h <= 0:
            return 0.0
        return self.gpufed_avg_jct_h / self.burst_now_avg_jct_h - 1.0


def _ratio(cost_usd: float, yardstick_usd: float) -> float:
    if yardstick_usd <= 0:
        return math.inf if cost_usd > 0 else 1.0
    return cost_usd / yardstick_usd


def _cut(cost_usd: float, baseline_usd: float) -> float:
    return 0.0 if baseline_usd <= 0 else 1.0 - cost_usd / baseline_usd


def weeks(rows: Sequence[Metrics]) -> list[str]:
    return sorted({r.week for r in rows})


def on_curve(policy: str, *, spot: bool) -> bool:
    """Whether a policy is a point of the fixed-wait curve (on demand), or of its spot-aware twin."""
    if policy.endswith("_spot") != spot:
        return False
    return policy.removesuffix("_spot") == "burst_now" or policy.startswith("fixed_wait_")


def curve(rows: Sequence[Metrics], size: float, *, spot: bool = False) -> list[Metrics]:
    """The fixed-wait curve at one size (burst-now as the wait of 0), sorted by average JCT; with
    `spot`, the same policies under gpufed's spot rule.

    `rows` must be of one week: a curve mixing weeks means nothing."""
    points = [r for r in rows if r.size_factor == size and on_curve(r.policy, spot=spot)]
    return sorted(points, key=lambda r: (r.avg_jct_h, -r.cloud_cost_usd))


def curve_cost_at(points: Sequence[Metrics], jct_h: float) -> tuple[float, bool]:
    xs = np.array([p.avg_jct_h for p in points])
    ys = np.array([p.cloud_cost_usd for p in points])
    clamped = bool(jct_h < xs.min() or jct_h > xs.max())
    return float(np.interp(jct_h, xs, ys)), clamped


def headlines(rows: Sequence[Metrics], policy: str = "gpufed") -> list[Headline]:
    """One headline per week and size, weeks in name order, then sizes in increasing order."""
    out = []
    for week in weeks(rows):
        of_week = [r for r in rows if r.week == week]
        for size in sorted({r.size_factor for r in of_week}):
            # Each policy's row at this size (the first, should a policy repeat).
            by_policy = {r.policy: r for r in reversed(of_week) if r.size_factor == size}
            gpufed, burst = by_policy.get(policy), by_policy.get("burst_now")
            points = curve(of_week, size)
            if gpufed is None or burst is None or not points:
                continue
            cost, clamped = curve_cost_at(points, gpufed.avg_jct_h)
            spot_points = curve(of_week, size, spot=True)
            spot_burst = by_policy.get("burst_now_spot")
            spot_cost, spot_clamped = (
                curve_cost_at(spot_points, gpufed.avg_jct_h) if spot_points else (None, False)
            )
            out.append(
                Headline(
                    size,
                    gpufed.cloud_cost_usd,
                    gpufed.avg_jct_h,
                    cost,
                    clamped,
                    burst.cloud_cost_usd,
                    burst.avg_jct_h,
                    week,
                    spot_cost,
                    spot_clamped,
                    None if spot_burst is None else spot_burst.cloud_cost_usd,
                    gpufed.deadlines,
                    gpufed.deadlines_missed,
                    burst.deadlines_missed,
                    len(set(gpufed.missed_deadline_ids) - set(burst.missed_deadline_ids)),
                )
            )
    return out


def figure_lines(heads: Sequence[Headline]) -> list[str]:
    """Per week and size, then (with several weeks) the worst week of each size.

    With one week the names carry only the size, as they always have; with several, the week too."""
    several = len({h.week for h in heads}) > 1
    lines = []
    for h in heads:
        tag = f"{h.week}_{h.size_factor:g}x" if several else f"{h.size_factor:g}x"
        lines.append(f"cost_ratio_vs_fixed_wait_curve_{tag}: {h.cost_ratio_vs_fixed_wait_curve:.3f} ratio")
        lines.append(f"cloud_cost_cut_vs_burst_now_{tag}: {h.cloud_cost_cut_vs_burst_now * 100:.1f} %")
        lines.append(f"avg_jct_vs_burst_now_{tag}: {h.avg_jct_vs_burst_now * 100:+.1f} %")
        lines += _spot_lines(h, tag)
        lines += _deadline_lines(h, tag)
    if several:
        lines += worst_lines(heads)
    return lines


def _spot_lines(h: Headline, tag: str) -> list[str]:
    ratio, cut = h.cost_ratio_vs_spot_fixed_wait_curve, h.cloud_cost_cut_vs_spot_burst_now
    lines = []
    if ratio is not None:
        lines.append(f"cost_ratio_vs_spot_fixed_wait_curve_{tag}: {ratio:.3f} ratio")
    if cut is not None:
        lines.append(f"cloud_cost_cut_vs_spot_burst_now_{tag}: {cut * 100:.1f} %")
    return lines


def _deadline_lines(h: Headline, tag: str) -> list[str]:
    if h.deadlines == 0:
        return []
    return [
        f"deadlines_missed_{tag}: {h.deadlines_missed} jobs",
        f"deadlines_missed_by_burst_now_{tag}: {h.burst_now_deadlines_missed} jobs",
        f"deadlines_missed_by_gpufed_met_by_burst_now_{tag}: {h.missed_by_gpufed_met_by_burst_now} jobs",
    ]


def worst_lines(heads: Sequence[Headline]) -> list[str]:
    """The worst week of each size: highest cost ratio, smallest cut, longest JCT against burst-now
    (and, with the spot-aware yardstick, the worst against it)."""
    lines = []
    for size in sorted({h.size_factor for h in heads}):
        of_size = [h for h in heads if h.size_factor == size]
        tag = f"{size:g}x"
        ratio = max(h.cost_ratio_vs_fixed_wait_curve for h in of_size)
        cut = min(h.cloud_cost_cut_vs_burst_now for h in of_size)
        jct = max(h.avg_jct_vs_burst_now for h in of_size)
        lines.append(f"worst_cost_ratio_vs_fixed_wait_curve_{tag}: {ratio:.3f} ratio")
        lines.append(f"worst_cloud_cost_cut_vs_burst_now_{tag}: {cut * 100:.1f} %")
        lines.append(f"worst_avg_jct_vs_burst_now_{tag}: {jct * 100:+.1f} %")
        spot_ratios = [r for h in of_size if (r := h.cost_ratio_vs_spot_fixed_wait_curve) is not None]
        spot_cuts = [c for h in of_size if (c := h.cloud_cost_cut_vs_spot_burst_now) is not None]
        if spot_ratios:
            lines.append(f"worst_cost_ratio_vs_spot_fixed_wait_curve_{tag}: {max(spot_ratios):.3f} ratio")
        if spot_cuts:
            lines.append(f"worst_cloud_cost_cut_vs_spot_burst_now_{tag}: {min(spot_cuts) * 100:.1f} %")
        if any(h.deadlines for h in of_size):
            # The week where gpufed missed most deadlines, and the most it missed that burst-now met.
            missed = max(h.deadlines_missed for h in of_size)
            only = max(h.missed_by_gpufed_met_by_burst_now for h in of_size)
            lines.append(f"deadlines_missed_{tag}: {missed} jobs")
            lines.append(f"deadlines_missed_by_gpufed_met_by_burst_now_{tag}: {only} jobs")
    return lines


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)


def markdown(rows: Sequence[Metrics], heads: Sequence[Headline]) -> str:
    shown = [
        ("policy", "policy"),
        ("private_gpus", "private GPUs"),
        ("cloud_cost_usd", "cloud USD"),
        ("jobs_in_cloud", "jobs in cloud"),
        ("avg_jct_h", "avg JCT h"),
        ("p95_jct_h", "p95 JCT h"),
        ("avg_queue_h", "avg queue h"),
        ("p95_queue_h", "p95 queue h"),
        ("private_utilisation", "private util"),
        ("jain_fairness", "Jain"),
        ("max_share_gap_pp", "max gap pp"),
        ("preemptions", "preemptions"),
        ("moves", "moves"),
        ("reclaims", "spot reclaims"),
        ("reclaims_resumed", "of them resumed"),
        ("deadlines_missed", "deadlines missed"),
        ("unfinished", "unfinished"),
        ("replay_s", "replay s"),
        ("replay_cpu_s", "replay CPU s"),
    ]
    out = []
    for size in sorted({r.size_factor for r in rows}):
        out.append(f"### Private size {size:g} x mean demand\n")
        out.append("| " + " | ".join(title for _, title in shown) + " |")
        out.append("|" + "---|" * len(shown))
        for row in (r for r in rows if r.size_factor == size):
            values = row.row()
            out.append("| " + " | ".join(_cell(values[key]) for key, _ in shown) + " |")
        out.append("")
    out.append(headline_table(heads))
    return "\n".join(out) + "\n"


def headline_table(heads: Sequence[Headline]) -> str:
    out = ["### Headline figures\n"]
    spot = any(h.spot_curve_cost_usd is not None for h in heads)
    title = (
        "| week | size | gpufed USD | gpufed avg JCT h | fixed-wait curve USD at that JCT | ratio "
        "| cut vs burst-now | avg JCT vs burst-now |"
    )
    if spot:
        title += " spot-aware curve USD at that JCT | ratio vs it | cut vs burst-now with spot |"
    deadlines = any(h.deadlines for h in heads)
    if deadlines:
        title += (
            " deadlines missed (of jobs with one), gpufed / burst-now | missed by gpufed, met by burst-now |"
        )
    out.append(title)
    out.append("|---" * 8 + "|" + ("---|" * 3 if spot else "") + ("---|" * 2 if deadlines else ""))
    for h in heads:
        clamp = " (clamped to the curve's end)" if h.clamped else ""
        line = (
            f"| {h.week} | {h.size_factor:g}x | {h.gpufed_cost_usd:,.0f} | {h.gpufed_avg_jct_h:.3f} | "
            f"{h.curve_cost_usd:,.0f}{clamp} | {h.cost_ratio_vs_fixed_wait_curve:.3f} | "
            f"{h.cloud_cost_cut_vs_burst_now * 100:.1f} % | {h.avg_jct_vs_burst_now * 100:+.1f} % |"
        )
        if spot:
            ratio, cut = h.cost_ratio_vs_spot_fixed_wait_curve, h.cloud_cost_cut_vs_spot_burst_now
            spot_clamp = " (clamped)" if h.spot_clamped else ""
            line += (
                f" {'-' if h.spot_curve_cost_usd is None else f'{h.spot_curve_cost_usd:,.0f}'}{spot_clamp} |"
                f" {'-' if ratio is None else f'{ratio:.3f}'} |"
                f" {'-' if cut is None else f'{cut * 100:.1f} %'} |"
            )
        if deadlines:
            line += (
                f" {h.deadlines_missed} / {h.burst_now_deadlines_missed} (of {h.deadlines:,}) |"
                f" {h.missed_by_gpufed_met_by_burst_now} |"
            )
        out.append(line)
    return "\n".join(out) + "\n"


def write_csv(rows: Sequence[Metrics], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow(row.row())


def read_csv(path: Path) -> list[Metrics]:
    """Rows written by `write_csv`, as `Metrics` (without their per-job lists of missed deadlines, which
    the CSV does not hold): for rows that a later run reuses rather than replays again. A column the
    file lacks (written before it existed) takes the field's default."""
    kinds = {f.name: f.type for f in fields(Metrics)}
    rows = []
    with path.open(newline="") as handle:
        for line, record in enumerate(csv.DictReader(handle), start=2):
            values: dict[str, object] = {}
            for name, text in record.items():
                kind = kinds.get(name)
                if kind is None or name == "missed_deadline_ids":
                    continue
                try:
                    values[name] = int(text) if kind == "int" else float(text) if kind == "float" else text
                except (TypeError, ValueError) as error:
                    raise ValueError(f"{path}:{line}: column {name}: {error}") from None
            rows.append(Metrics(**values))  # type: ignore[arg-type]
    return rows


def plot(rows: Sequence[Metrics], size: float, path: Path) -> None:
    """Cloud cost against average JCT at one size: the fixed-wait curve, burst-now and gpufed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = curve(rows, size)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(
        [p.avg_jct_h for p in points],
        [p.cloud_cost_usd for p in points],
        "o-",
        color="tab:blue",
        label="fixed wait (burst-now = 0)",
    )
    for p in points:
        label = p.policy.removeprefix("fixed_wait_") if p.policy != "burst_now" else "0"
        ax.annotate(
            label, (p.avg_jct_h, p.cloud_cost_usd), textcoords="offset points", xytext=(4, 4), fontsize=8
        )
    spot_points = curve(rows, size, spot=True)
    if spot_points:
        ax.plot(
            [p.avg_jct_h for p in spot_points],
            [p.cloud_cost_usd for p in spot_points],
            "s--",
            color="tab:orange",
            markersize=4,
            label="fixed wait with gpufed's spot rule",
        )
    for row in rows:
        if row.size_factor != size:
            continue
        if row.policy == "gpufed":
            ax.plot(row.avg_jct_h, row.cloud_cost_usd, "*", markersize=14, color="tab:red", label="gpufed")
        elif row.policy.startswith("gpufed_"):
            ax.plot(row.avg_jct_h, row.cloud_cost_usd, "x", color="tab:red")
        elif row.policy == "private_only":
            ax.axvline(row.avg_jct_h, color="grey", linestyle="--", label="private only (no cloud)")
    ax.set_xlabel("average job completion time (h)")
    ax.set_ylabel("cloud cost (USD)")
    week = rows[0].week if rows else ""
    ax.set_title(f"{week or 'trace'} replay, private GPUs = {size:g} x mean demand")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_week(rows: Sequence[Metrics], out: Path, command: str) -> None:
    """One week's table, CSV and plots under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "replay.csv")
    (out / "replay.md").write_text(
        f"# Replay results: {rows[0].week}\n\nProduced by `{command}`.\n\n" + markdown(rows, headlines(rows))
    )
    for size in sorted({r.size_factor for r in rows}):
        plot(rows, size, out / f"replay_cost_vs_jct_{size:g}x.png")


def write_all(rows: Sequence[Metrics], out: Path, command: str) -> list[str]:
    """Table, CSV and plots under `out` (one directory per week when there are several, and a summary
    `weeks.md`); returns the headline figure lines."""
    heads = headlines(rows)
    names = weeks(rows)
    if len(names) <= 1:
        write_week(rows, out, command)
        return figure_lines(heads)
    for week in names:
        write_week([r for r in rows if r.week == week], out / week, command)
    write_csv(rows, out / "weeks.csv")
    lines = figure_lines(heads)
    (out / "weeks.md").write_text(
        f"# Replay results over {len(names)} weeks\n\nProduced by `{command}`; one directory per week "
        "holds its table and plots.\n\n"
        + headline_table(heads)
        + "\n### Worst week per size\n\n"
        + "\n".join(f"    {line}" for line in worst_lines(heads))
        + "\n"
    )
    return lines
