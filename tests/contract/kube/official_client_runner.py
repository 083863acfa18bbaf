"""Run by the official client's own virtualenv, never by the project's: imports only `kubernetes`.

    python official_client_runner.py KUBECONFIG CONTEXT OPERATION JSON_ARGS

prints one JSON document: {"ok": result} or {"error": {"status": code, "reason": ..., "body": ...}}.
Operations:
- call: {"api": "CoreV1Api", "method": "list_node", "kwargs": {...}} -> the result, serialized by
  the client itself (so a model that cannot read the server's answer fails here, as it would for a
  user);
- watch: {"api": ..., "method": ..., "kwargs": {...}, "timeout_s": N, "max_events": M} -> the events
  as [{"type": ..., "name": ..., "resource_version": ...}];
- log: {"name": ..., "namespace": ..., "kwargs": {...}} -> the log text (read_namespaced_pod_log).
"""

import contextlib
import json
import sys
import time

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException


def _api(name: str, api_client: client.ApiClient) -> object:
    return getattr(client, name)(api_client)


def main() -> int:
    kubeconfig, context, operation, raw = sys.argv[1:5]
    args = json.loads(raw)
    api_client = config.new_client_from_config(config_file=kubeconfig, context=context or None)
    try:
        if operation == "call":
            method = getattr(_api(args["api"], api_client), args["method"])
            result = method(*args.get("args", []), **args.get("kwargs", {}))
            out = api_client.sanitize_for_serialization(result)
        elif operation == "watch":
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
            out = events
        elif operation == "log":
            core = client.CoreV1Api(api_client)
            out = core.read_namespaced_pod_log(args["name"], args["namespace"], **args.get("kwargs", {}))
        else:
            raise SystemExit(f"unknown operation {operation}")
    except ApiException as exc:
        body = exc.body
        with contextlib.suppress(ValueError):
            body = json.loads(body) if body else None
        print(json.dumps({"error": {"status": exc.status, "reason": exc.reason, "body": body}}))
        return 0
    print(json.dumps({"ok": out}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
