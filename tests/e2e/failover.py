"""A client that keeps submitting through server failures: the HA and upgrade tests' load."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import grpc

from federation.api.client import GpufedClient
from tests.e2e.harness import manifest


class FailoverSubmitter:
    """Submits small jobs all along, to whichever server answers. A server that is down (or died
    mid-call) gets the same idempotency key again on the next one: if the first had accepted it, the
    retry finds that job instead of making another, so `accepted` holds each key's one job.

    `targets` and `tokens` are read when the thread starts (token files appear once a server has
    bootstrapped); submissions take the tokens in turn."""

    def __init__(
        self,
        targets: Callable[[], Sequence[str]],
        tokens: Callable[[], Sequence[str]],
        *,
        prefix: str,
        duration: str,
        pace_s: float,
    ) -> None:
        self.targets, self.tokens = targets, tokens
        self.prefix, self.duration, self.pace_s = prefix, duration, pace_s
        self.accepted: dict[str, str] = {}  # idempotency key -> job id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="submitter")

    def _run(self) -> None:
        tokens = list(self.tokens())
        i = 0
        while not self.stop.is_set():
            key = f"{self.prefix}{i}"
            text = manifest(f"j{i}", workers=1, gpus=2, duration=self.duration)
            turn = i
            while not self.stop.is_set():
                targets = self.targets()
                try:
                    with GpufedClient(
                        targets[turn % len(targets)], tokens[i % len(tokens)], timeout_s=3
                    ) as client:
                        self.accepted[key] = client.submit(text, idempotency_key=key).job_id
                    break
                except grpc.RpcError:
                    turn += 1
                    time.sleep(0.1)
            i += 1
            time.sleep(self.pace_s)
