"""The dashboard's charts, drawn on the server as SVG: plain strings, every text escaped.

Three charts of a :class:`~taskmill_http.metrics.Timeline` (the service's own metrics,
as the caller may see them): tasks finished per minute by status (stacked bars) with
the tasks enqueued and retried (lines), the queue depth (pending, waiting, running), and
the latency from due to start (average, p95 and maximum per minute).

Each chart is an ``<svg role="img">`` named by its ``<title>`` and ``<desc>`` (the
totals, in words), with axes labelled in time (UTC, which the page's script shows in
the browser's time zone: ``data-time``) and counts, and a legend. What a test or a
script reads: each series is a ``<g data-series=... >`` with ``data-total`` (bars: the
sum; lines: ``data-last`` and ``data-max``), each bar and point a shape with
``data-start``/``data-at`` and ``data-value`` and a ``<title>`` saying the same.

No script, no library: the page stays a server-rendered page (the workers page's
in-place refresh swaps the charts every few seconds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from html import escape

import attrs

from taskmill_http.metrics import Timeline

WIDTH = 720
HEIGHT = 240
LEFT, RIGHT, TOP, BOTTOM = 56, 14, 30, 30
"""The plot's margins: the y labels left, the legend on top, the x labels below."""


@attrs.frozen
class Series:
    """One series of a chart."""

    key: str
    """Its CSS class (``s-KEY``) and ``data-series``."""
    label: str
    kind: str
    """``bar`` (stacked with the other bars of the chart) or ``line``."""
    points: tuple[tuple[float, float | None], ...]
    """(Unix seconds, value) of each point; None: no value there (a gap)."""


def _attr(value: object) -> str:
    return escape(str(value), quote=True)


def _number(value: float) -> str:
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.3g}"


def duration(seconds: float) -> str:
    """A latency for people: ``850 ms``, ``2.5 s``, ``3.2 min``."""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{seconds / 60:.3g} min"


def _nice_step(top: float, ticks: int = 4) -> float:
    raw = top / ticks
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power  # pragma: no cover - the loop ends at 10


def _scale_top(values: Sequence[float], integer: bool) -> tuple[float, float]:
    """The top of the y axis and its tick step, for ``values`` (counts: whole steps)."""
    top = max([0.0, *values])
    if top <= 0:
        return (4.0, 1.0) if integer else (1.0, 0.25)
    step = _nice_step(top)
    if integer:
        step = max(1.0, math.ceil(step))
    return step * math.ceil(top / step), step


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def _utc_clock(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%H:%M")


def chart(
    chart_id: str,
    title: str,
    summary: str,
    series: Sequence[Series],
    span: tuple[float, float],
    *,
    bar_seconds: float = 60.0,
    unit: str = "tasks",
) -> str:
    """One chart as an SVG element (a string of escaped markup).

    :param span: the time axis, (start, end) in Unix seconds.
    :param unit: ``tasks`` (whole counts) or ``seconds`` (durations).
    """
    start, end = span
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    bars = [s for s in series if s.kind == "bar"]
    lines = [s for s in series if s.kind == "line"]
    stacks: dict[float, float] = {}
    for s in bars:
        for at, value in s.points:
            stacks[at] = stacks.get(at, 0.0) + (value or 0.0)
    values = list(stacks.values())
    values += [v for s in lines for _, v in s.points if v is not None]
    top, step = _scale_top(values, integer=unit == "tasks")

    def x(at: float) -> float:
        return LEFT + (at - start) / (end - start) * plot_w

    def y(value: float) -> float:
        return TOP + plot_h - value / top * plot_h

    def label(value: float) -> str:
        return duration(value) if unit == "seconds" else _number(value)

    out: list[str] = []
    out.append(
        f'<svg class="chart" id="{_attr(chart_id)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-labelledby="{_attr(chart_id)}-t {_attr(chart_id)}-d" '
        f'data-unit="{_attr(unit)}" data-y-max="{_attr(_number(top))}" '
        f'xmlns="http://www.w3.org/2000/svg">'
    )
    out.append(f'<title id="{_attr(chart_id)}-t">{escape(title)}</title>')
    out.append(f'<desc id="{_attr(chart_id)}-d">{escape(summary)}</desc>')
    # The y axis: grid lines and their values.
    out.append('<g class="axis y-axis" aria-hidden="true">')
    tick = 0.0
    while tick <= top + 1e-9:
        ty = y(tick)
        out.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}"/>'
            f'<text x="{LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end">{escape(label(tick))}</text>'
        )
        tick += step
    out.append(
        f'<text class="axis-title" x="12" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {TOP + plot_h / 2:.1f})">'
        f"{'seconds' if unit == 'seconds' else 'tasks'}</text>"
    )
    out.append("</g>")
    # The x axis: a label every 10 minutes (every 5 on a short span).
    out.append('<g class="axis x-axis" aria-hidden="true">')
    out.append(
        f'<line class="base" x1="{LEFT}" x2="{WIDTH - RIGHT}" '
        f'y1="{TOP + plot_h}" y2="{TOP + plot_h}"/>'
    )
    every = 600 if end - start > 1800 else 300 if end - start > 600 else 60
    mark = math.ceil(start / every) * every
    while mark <= end:
        mx = x(mark)
        out.append(
            f'<line class="tick" x1="{mx:.1f}" x2="{mx:.1f}" y1="{TOP + plot_h}" '
            f'y2="{TOP + plot_h + 4}"/>'
            f'<text x="{mx:.1f}" y="{HEIGHT - BOTTOM + 18}" text-anchor="middle" '
            f'data-time="{_attr(_iso(mark))}">{escape(_utc_clock(mark))}</text>'
        )
        mark += every
    out.append(
        f'<text class="axis-title" x="{WIDTH - RIGHT}" y="{HEIGHT - 2}" '
        f'text-anchor="end" data-zone>UTC</text>'
    )
    out.append("</g>")
    # Bars, stacked in the order given.
    base: dict[float, float] = {}
    width = max(1.0, bar_seconds / (end - start) * plot_w - 1.5)
    for s in bars:
        total = sum(v or 0 for _, v in s.points)
        out.append(
            f'<g class="series s-{_attr(s.key)}" data-series="{_attr(s.key)}" '
            f'data-total="{_attr(_number(total))}">'
        )
        for at, value in s.points:
            if not value:
                continue
            below = base.get(at, 0.0)
            base[at] = below + value
            y0, y1 = y(below), y(below + value)
            text = f"{_utc_clock(at)} UTC: {label(value)} {s.label}"
            out.append(
                f'<rect x="{x(at) + 0.75:.1f}" y="{y1:.1f}" width="{width:.1f}" '
                f'height="{max(0.5, y0 - y1):.1f}" data-start="{_attr(_iso(at))}" '
                f'data-value="{_attr(_number(value))}"><title>{escape(text)}</title></rect>'
            )
        out.append("</g>")
    # Lines, with a dot at each point (or the last, for a dense series).
    for s in lines:
        known = [v for _, v in s.points if v is not None]
        last = known[-1] if known else None
        peak = max(known) if known else None
        out.append(
            f'<g class="series line s-{_attr(s.key)}" data-series="{_attr(s.key)}" '
            f'data-last="{_attr("" if last is None else _number(last))}" '
            f'data-max="{_attr("" if peak is None else _number(peak))}" '
            f'data-total="{_attr(_number(sum(known)))}">'
        )
        words = "no value" if last is None else f"last {label(last)}, most {label(peak or 0)}"
        out.append(f"<title>{escape(s.label)}: {escape(words)}</title>")
        runs: list[list[str]] = [[]]
        for at, value in s.points:
            if value is None:
                runs.append([])
            else:
                runs[-1].append(f"{x(at):.1f},{y(value):.1f}")
        for run in runs:
            if len(run) > 1:
                out.append(f'<polyline points="{" ".join(run)}"/>')
        dense = len(s.points) > 90
        for index, (at, value) in enumerate(s.points):
            if value is None or (dense and index != len(s.points) - 1):
                continue
            if unit == "tasks" and value == 0 and not dense:
                continue  # a count's zeros lie on the axis: no dot each
            text = f"{_utc_clock(at)} UTC: {s.label} {label(value)}"
            out.append(
                f'<circle cx="{x(at):.1f}" cy="{y(value):.1f}" r="2.5" '
                f'data-at="{_attr(_iso(at))}" data-value="{_attr(_number(value))}">'
                f"<title>{escape(text)}</title></circle>"
            )
        out.append("</g>")
    # The legend, along the top.
    out.append('<g class="legend">')
    lx = LEFT
    for s in series:
        swatch = (
            f'<rect class="swatch" x="{lx}" y="8" width="12" height="12"/>'
            if s.kind == "bar"
            else f'<line class="swatch" x1="{lx}" x2="{lx + 12}" y1="14" y2="14"/>'
        )
        out.append(
            f'<g class="s-{_attr(s.key)}{" line" if s.kind == "line" else ""}">{swatch}'
            f'<text x="{lx + 16}" y="18">{escape(s.label)}</text></g>'
        )
        lx += 24 + 7 * len(s.label)
    out.append("</g>")
    out.append("</svg>")
    return "".join(out)


@attrs.frozen
class Charts:
    """The three charts of a timeline, and the totals they show."""

    throughput: str
    depth: str
    latency: str
    totals: dict[str, int]


def charts(timeline: Timeline) -> Charts:
    """The charts of ``timeline`` (as SVG strings)."""
    buckets = timeline.buckets
    width = float(timeline.bucket_seconds)
    start = buckets[0].start.timestamp()
    end = buckets[-1].start.timestamp() + width
    span = (start, end)
    totals = {
        name: sum(getattr(b, name) for b in buckets)
        for name in ("completed", "failed", "cancelled", "retried", "enqueued", "started")
    }

    def bucket_series(key: str, label: str, kind: str) -> Series:
        shift = width / 2 if kind == "line" else 0.0
        return Series(
            key,
            label,
            kind,
            tuple((b.start.timestamp() + shift, float(getattr(b, key))) for b in buckets),
        )

    minutes = len(buckets)
    throughput = chart(
        "chart-throughput",
        f"Throughput per minute, last {minutes} minutes",
        f"Finished: {totals['completed']} completed, {totals['failed']} failed, "
        f"{totals['cancelled']} cancelled; {totals['retried']} retried; "
        f"{totals['enqueued']} enqueued.",
        [
            bucket_series("completed", "completed", "bar"),
            bucket_series("failed", "failed", "bar"),
            bucket_series("cancelled", "cancelled", "bar"),
            bucket_series("enqueued", "enqueued", "line"),
            bucket_series("retried", "retried", "line"),
        ],
        span,
        bar_seconds=width,
    )
    samples = timeline.queue_depth
    last = samples[-1] if samples else None
    depth = chart(
        "chart-depth",
        f"Queue depth, last {minutes} minutes",
        "No sample yet."
        if last is None
        else f"Now: {last.pending} pending ({last.waiting} waiting for a dependency), "
        f"{last.running} running; sampled every {_number(timeline.depth_sample_seconds)} s.",
        [
            Series(
                name,
                name,
                "line",
                tuple((d.at.timestamp(), float(getattr(d, name))) for d in samples),
            )
            for name in ("pending", "running", "waiting")
        ],
        span,
    )
    starts = sum(b.latency.count for b in buckets)
    worst = max((b.latency.max_seconds or 0.0 for b in buckets), default=0.0)
    latency = chart(
        "chart-latency",
        f"Latency from due to start, last {minutes} minutes",
        "No start yet."
        if not starts
        else f"{starts} starts; the slowest waited {duration(worst)}.",
        [
            Series(
                "avg",
                "average",
                "line",
                tuple((b.start.timestamp() + width / 2, b.latency.avg_seconds) for b in buckets),
            ),
            Series(
                "p95",
                "p95",
                "line",
                tuple((b.start.timestamp() + width / 2, b.latency.p95_seconds) for b in buckets),
            ),
            Series(
                "max",
                "max",
                "line",
                tuple((b.start.timestamp() + width / 2, b.latency.max_seconds) for b in buckets),
            ),
        ],
        span,
        unit="seconds",
    )
    return Charts(throughput=throughput, depth=depth, latency=latency, totals=totals)
