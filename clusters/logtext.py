"""The text of a pod log read with timestamps, cut as the pod log API would cut it.

Shared by the two places that hold a copy of a log after its pod is gone: the backend's copy of a
killed pod (`clusters.kubernetes.last_words`) and federation's kept tails (`federation.joblogs`).
Each line starts with the RFC 3339 stamp (nanoseconds) the API adds when asked for `timestamps`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from clusters.api import LogOptions


def last_bytes(data: bytes, keep_bytes: int) -> bytes:
    """The tail of a log that fits `keep_bytes`, starting at a whole line."""
    if len(data) <= keep_bytes:
        return data
    tail = data[-keep_bytes:]
    cut = tail.find(b"\n") + 1
    return tail[cut:] if 0 < cut < len(tail) else tail


def stamp_s(stamp: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 stamp with up to nanoseconds."""
    text = stamp.rstrip("Z")
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    try:
        return datetime.fromisoformat(text + "+00:00").timestamp()
    except ValueError:
        return None


def stamp_ns(stamp: str) -> int | None:
    """Nanoseconds since the epoch of an RFC 3339 stamp, exactly: the instant to compare lines by.

    Never compare the stamps as strings: Go's RFC3339Nano (what the kubelet writes with
    `timestamps=true`) trims trailing zeros of the fraction, so `...03.1Z` is later than `...03.12Z`
    as text and earlier as a time. A float of seconds would round two lines a few nanoseconds apart
    into one instant."""
    text = stamp[:-1] if stamp.endswith("Z") else stamp
    head, dot, frac = text.partition(".")
    if dot and not (frac.isdigit() and len(frac) <= 9):
        return None
    try:
        seconds = int(datetime.fromisoformat(head + "+00:00").timestamp())
    except ValueError:
        return None
    return seconds * 1_000_000_000 + (int(frac.ljust(9, "0")) if dot else 0)


def format_stamp(at_s: float) -> str:
    """Go's RFC3339Nano, as the kubelet stamps a line: UTC, trailing zeros of the fraction dropped
    (and its dot on a whole second). Microseconds at most: a float holds no more here."""
    text = datetime.fromtimestamp(at_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f").rstrip("0").rstrip(".")
    return f"{text}Z"


def split_stamp(line: str) -> tuple[str, str]:
    stamp, _, text = line.partition(" ")
    return stamp, text


def select_lines(data: bytes, options: LogOptions, now_s: float) -> list[str]:
    """The lines of a stamped log that `since_s`, `tail_lines` and `timestamps` ask for."""
    lines = data.decode("utf-8", "replace").splitlines()
    if options.since_s is not None:
        oldest = now_s - options.since_s
        lines = [ln for ln in lines if (s := stamp_s(split_stamp(ln)[0])) is None or s >= oldest]
    if options.tail_lines is not None:
        lines = lines[-options.tail_lines :] if options.tail_lines else []
    if not options.timestamps:
        lines = [split_stamp(ln)[1] for ln in lines]
    return lines
