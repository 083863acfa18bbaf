"""Watch streams read by a thread each or by the shared reader, beside a busy event loop (issue 33).

The server's watch events at 100 member clusters: a writer process serves `--streams` chunked watch
responses on loopback and writes `--rate` events a second over them (each about the size of a pod's
event, stamped with its send time); this process reads them as the server does, through urllib3's
responses, either with a thread blocked on each stream (`threads`, as before the shared reader) or
with `clusters.kubernetes.watchreader` (`reader`, one thread, with its round gap or none), and decodes
each event. Beside them a thread stands for the server's event loop: pure-Python work that gives the
GIL up only as often as a busy loop does (a 1 ms sleep every 10 ms), with the server's switch
interval (0.5 ms). Per mode: the events' delivery delay (p50, p99), this process's CPU and context
switches an event, and how much work the loop thread got done (its share of the GIL).

    python bench/watch_reader.py            # 400 streams, 2,400 events/s, 10 s a mode
    python bench/watch_reader.py --quick    # 100 streams, 2 s a mode
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import urllib3  # noqa: E402

from clusters.kubernetes.kube import KubeApi, decode_json  # noqa: E402
from clusters.kubernetes.watchreader import WatchReader, open_stream  # noqa: E402

HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
PAD = "x" * 1800
# The streams stay open this long after the last event; the figures are taken within it.
HOLD_S = 2.0  # a pod's watch event is about 2 KB


def writer(port_out: Any, streams: int, rate: float, seconds: float) -> None:
    """The API servers: accept `streams` watches, then write events round-robin at `rate` a second."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=streams)
    port_out.put(listener.getsockname()[1])
    conns = []
    for _ in range(streams):
        conn, _ = listener.accept()
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(4096)
        conn.sendall(HEADERS)
        conns.append(conn)
    began = time.monotonic()
    sent = 0
    while (now := time.monotonic()) - began < seconds:
        due = int((now - began) * rate)
        while sent < due:
            body = json.dumps(
                {
                    "type": "MODIFIED",
                    "object": {"metadata": {"name": f"p{sent}"}, "pad": PAD},
                    "sent": time.time(),
                }
            ).encode()
            conns[sent % streams].sendall(f"{len(body) + 1:x}\r\n".encode() + body + b"\n\r\n")
            sent += 1
        time.sleep(0.001)
    # Held open a moment, so that the reading side counts its threads' switches while they live.
    time.sleep(HOLD_S)
    for conn in conns:
        conn.sendall(b"0\r\n\r\n")
        conn.close()


def switches() -> int:
    total = 0
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(mode: str, streams: int, rate: float, seconds: float, gap_s: float) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    port_q = ctx.Queue()
    proc = ctx.Process(target=writer, args=(port_q, streams, rate, seconds))
    proc.start()
    port = port_q.get(timeout=30)
    pool = urllib3.HTTPConnectionPool(
        "127.0.0.1", port, maxsize=streams, timeout=urllib3.Timeout(connect=10, read=60)
    )
    delays: list[float] = []
    lock = threading.Lock()

    def take(line: bytes) -> bool:
        event = decode_json(line)
        delay = time.time() - event["sent"]
        with lock:
            delays.append(delay)
        return True

    stop = threading.Event()
    work = [0]
    loop_cpu = [0.0]

    def loop_thread() -> None:
        # The server's event loop: Python work, the GIL given up for 1 ms every 10 ms (its epoll).
        began = time.thread_time()
        while not stop.is_set():
            end = time.perf_counter() + 0.01
            while time.perf_counter() < end:
                work[0] += 1
            time.sleep(0.001)
        loop_cpu[0] = time.thread_time() - began

    responses = [
        pool.urlopen("GET", f"/w{i}", preload_content=False, retries=False, release_conn=False)
        for i in range(streams)
    ]
    busy = threading.Thread(target=loop_thread, daemon=True)
    cpu0, sw0, t0 = cpu_s(), switches(), time.monotonic()
    busy.start()
    reader = WatchReader("bench-watch-reader", gap_s=gap_s) if mode == "reader" else None
    threads: list[threading.Thread] = []
    ended = []
    for response in responses:
        if reader is not None:
            stream = open_stream(response, take, name="bench", reader=reader)
            assert stream is not None
            ended.append(stream.ended)
        else:

            def follow(r: urllib3.BaseHTTPResponse = response) -> None:
                for line in KubeApi.lines(r):
                    take(line)

            thread = threading.Thread(target=follow, daemon=True)
            thread.start()
            threads.append(thread)
    # Every event is in by the end of the writing (the delays are milliseconds to a second); the
    # streams are still open, their threads alive, when the figures are taken.
    time.sleep(max(0.0, t0 + seconds + HOLD_S / 2 - time.monotonic()))
    elapsed = time.monotonic() - t0
    stop.set()
    busy.join()
    # The watches' CPU: the process's, less the loop thread's own.
    cpu, sw = cpu_s() - cpu0 - loop_cpu[0], switches() - sw0
    for event in ended:
        event.wait(60)
    for thread in threads:
        thread.join(60)
    if reader is not None:
        reader.close()
    for response in responses:
        response.close()
    proc.join(30)
    n = max(len(delays), 1)
    ordered = sorted(delays)
    return {
        "events": len(delays),
        "delay_p50_ms": 1000 * statistics.median(ordered) if ordered else float("nan"),
        "delay_p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))] if ordered else float("nan"),
        "cpu_us_per_event": 1e6 * cpu / n,
        "switches_per_event": sw / n,
        "loop_work_per_s": work[0] / elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--streams", type=int, default=None)
    parser.add_argument("--rate", type=float, default=2400.0, help="events a second over all streams")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--modes", default="threads,reader,reader-nogap")
    args = parser.parse_args()
    streams = args.streams or (100 if args.quick else 400)
    seconds = args.seconds or (2.0 if args.quick else 10.0)
    sys.setswitchinterval(0.0005)  # the server's (federation/runtime)
    print(
        f"uptime: {os.getloadavg()[0]:.2f}; {streams} streams, {args.rate:g} events/s, {seconds:g} s a mode"
    )
    figures: list[str] = []
    for mode in args.modes.split(","):
        gap = 0.0 if mode == "reader-nogap" else 0.01
        result = run("reader" if mode.startswith("reader") else "threads", streams, args.rate, seconds, gap)
        print(mode, {k: round(v, 2) for k, v in result.items()}, flush=True)
        name = mode.replace("-", "_")
        figures += [
            f"watch_{name}_delay_p50_ms: {result['delay_p50_ms']:.2f} ms",
            f"watch_{name}_delay_p99_ms: {result['delay_p99_ms']:.2f} ms",
            f"watch_{name}_cpu_us_per_event: {result['cpu_us_per_event']:.1f} us",
            f"watch_{name}_switches_per_event: {result['switches_per_event']:.2f} switches",
            f"watch_{name}_loop_work_per_s: {result['loop_work_per_s']:.0f} iterations",
        ]
    print("\n".join(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
