"""Run by the official client's own virtualenv, never by the project's: imports only `kubernetes`.

    python official_client_runner.py

reads requests, one JSON document a line, from stdin: {"kubeconfig": PATH, "context": NAME or "",
"operation": OPERATION, "args": {...}}; and answers each with one line on stdout: {"ok": result} or
{"error": {"status": code, "reason": ..., "body": ...}}. It runs until stdin closes: importing the
client costs two seconds of CPU (its generated APIs build a model class per Kubernetes kind), so a
test process keeps one runner for all its requests instead of paying that per request.
Operations:
- call: {"api": "CoreV1Api", "method": "list_node", "kwargs": {...}} -> the result, serialized by
  the client itself (so a model that cannot read the server's answer fails here, as it would for a
  user);
- watch: {"api": ..., "method": ..., "kwargs": {...}, "timeout_s": N, "max_events": M} -> the events
  as [{"type": ..., "name": ..., "resource_version": ...}], from the first to the M-th or until N s
  have passed, whichever comes first;
- log: {"name": ..., "namespace": ..., "kwargs": {...}} -> the log text (read_namespaced_pod_log);
- batch: {"operations": [{"operation": "call", "args": {...}}, ...], "stop_at_error": bool} -> one
  answer ({"ok": ...} or {"error": ...}) per operation, made one after the other. With
  `stop_at_error` the operations after a refused one are not made, as when each is its own call.
Each request gets an `ApiClient` of its own, loaded from the kubeconfig it names.
"""

import contextlib
import json
import sys
import time
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException


def _api(name: str, api_client: client.ApiClient) -> object:
    return getattr(client, name)(api_client)


def _perform(operation: str, args: dict[str, Any], api_client: client.ApiClient) -> Any:
    if operation == "call":
        method = getattr(_api(args["api"], api_client), args["method"])
        result = method(*args.get("args", []), **args.get("kwargs", {}))
        return api_client.sanitize_for_serialization(result)
    if operation == "watch":
        method = getattr(_api(args["api"], api_client), args["method"])
        events = []
        stream = watch.Watch()
        deadline = time.monotonic() + float(args.get("timeout_s", 5))
        kwargs = dict(args.get("kwargs", {}))
        kwargs.setdefault("timeout_seconds", int(args.get("timeout_s", 5)))
        for event in stream.stream(method, **kwargs):
            obj = event["object"]
            meta = obj.metadata if hasattr(obj, "metadata") else None
            events.append(
                {
                    "type": event["type"],
                    "name": getattr(meta, "name", None),
                    "resource_version": getattr(meta, "resource_version", None),
                    "object": api_client.sanitize_for_serialization(obj),
                }
            )
            if len(events) >= int(args.get("max_events", 1000)) or time.monotonic() > deadline:
                stream.stop()
        return events
    if operation == "log":
        core = client.CoreV1Api(api_client)
        return core.read_namespaced_pod_log(args["name"], args["namespace"], **args.get("kwargs", {}))
    raise SystemExit(f"unknown operation {operation}")


def _answer(operation: str, args: dict[str, Any], api_client: client.ApiClient) -> dict[str, Any]:
    """{"ok": result}, or {"error": ...} for a request the server refused."""
    try:
        return {"ok": _perform(operation, args, api_client)}
    except ApiException as exc:
        body = exc.body
        with contextlib.suppress(ValueError):
            body = json.loads(body) if body else None
        return {"error": {"status": exc.status, "reason": exc.reason, "body": body}}


def _handle(request: dict[str, Any]) -> dict[str, Any]:
    operation, args = request["operation"], request["args"]
    api_client = config.new_client_from_config(
        config_file=request["kubeconfig"], context=request["context"] or None
    )
    with api_client:
        if operation != "batch":
            return _answer(operation, args, api_client)
        answers = []
        for step in args["operations"]:
            answers.append(_answer(step["operation"], step["args"], api_client))
            if "error" in answers[-1] and args.get("stop_at_error", True):
                break
        return {"ok": answers}


def main() -> int:
    for line in sys.stdin:
        print(json.dumps(_handle(json.loads(line)), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
