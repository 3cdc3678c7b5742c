"""Helpers the recorder's tests share."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone

from hypothesis import strategies as st

_JSON_KEYS = st.sampled_from(["status", "data", "result", "resultType", "metric", "values", "value", "__name__", "gpu",
                              "kind", "items", "containerStatuses", "lastState", "terminated", "reason", "exitCode",
                              "finishedAt", "restartCount", "involvedObject", "regarding", "lastTimestamp", "series",
                              "count", "metadata", "creationTimestamp", "state", "fields", "schema", "results", "frames",
                              "jsonPayload", "logName", "x"])
_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6),
                               st.sampled_from(["Event", "OOMKilled", "matrix", "vllm:kv_cache_usage_perc", "time",
                                                "DCGM_FI_DEV_FB_USED", "2025-01-01T00:00:00Z", 137])),
                     lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(_JSON_KEYS, c, max_size=5)), max_leaves=30)


def _export(lines: list[str], shape: str) -> str:
    """Real log lines as a cloud logging service exports them: Google Cloud Logging's `gcloud logging
    read --format=json` (LogEntry objects, the line in textPayload, newest first unless --order=asc),
    AWS CloudWatch Logs' `aws logs filter-log-events` (events with message and a time in ms), Azure
    Monitor Logs' ContainerLogV2 rows as `az monitor log-analytics query` prints them or as the portal
    exports them to CSV (its times as '5/19/2025, 10:00:00.123 AM', UTC)."""
    t0 = 1747648800  # 2025-05-19T10:00:00Z
    if shape.startswith("azure"):
        rows = [{"TableName": "PrimaryResult", "TimeGenerated": datetime.fromtimestamp(t0 + i, tz=timezone.utc),
                 "Computer": "aks-gpupool-12345678-vmss000000", "ContainerName": "vllm", "PodName": "vllm-0",
                 "PodNamespace": "default", "LogMessage": ln, "LogSource": "stderr" if "ERROR" in ln else "stdout"}
                for i, ln in enumerate(lines)]
        if shape == "azure-cli":
            return json.dumps([{**r, "TimeGenerated": r["TimeGenerated"].strftime("%Y-%m-%dT%H:%M:%S.123Z")} for r in rows],
                              indent=2)
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["TimeGenerated [UTC]", *list(rows[0])[2:]])
        for r in rows:
            d = r["TimeGenerated"]
            w.writerow([f"{d.month}/{d.day}/{d.year}, {d.hour % 12 or 12}:{d:%M:%S}.123 {'AM' if d.hour < 12 else 'PM'}",
                        *list(r.values())[2:]])
        return out.getvalue()
    if shape == "journald-pretty":  # (journalctl -o json-pretty: objects over many lines, one after another)
        return "".join(json.dumps({"__CURSOR": f"s=1;i={i}", "__REALTIME_TIMESTAMP": str((t0 + i) * 10**6 + 123000),
                                   "_HOSTNAME": "gpu-node-1", "SYSLOG_IDENTIFIER": "vllm", "MESSAGE": ln, "_PID": "11574"},
                                  indent=8, separators=(",", " : ")) + "\n" for i, ln in enumerate(lines))
    if shape == "grafana-json":  # (Grafana's logs download as JSON: the line, its time in ns and as ISO)
        return json.dumps([{"line": ln, "timestamp": str(((t0 + i) * 1000 + 123) * 10**6),
                            "date": datetime.fromtimestamp(t0 + i, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.123Z"),
                            "fields": {"app": "vllm", "pod": "vllm-0"}} for i, ln in enumerate(lines)], indent=2)
    if shape == "splunk-csv":  # (Splunk's export of a search: _time with its zone, the line in _raw)
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["_time", "host", "source", "sourcetype", "_raw"])
        for i, ln in enumerate(lines):
            t = datetime.fromtimestamp(t0 + i, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.123+00:00")
            w.writerow([t, "gpu-node-1", "/var/log/containers/vllm-0_default_vllm.log", "kube:container:vllm", ln])
        return out.getvalue()
    if shape == "aws":
        events = [{"logStreamName": "vllm/vllm/0a1b", "timestamp": (t0 + i) * 1000 + 123, "message": ln,
                   "ingestionTime": (t0 + i) * 1000 + 180, "eventId": str(37000000 + i)} for i, ln in enumerate(lines)]
        return json.dumps({"events": events, "searchedLogStreams": [{"logStreamName": "vllm/vllm/0a1b",
                                                                     "searchedCompletely": True}]}, indent=4)
    entries = [{"insertId": f"{i:012x}", "labels": {"compute.googleapis.com/resource_name": "gke-gpu-node-1"},
                "logName": "projects/p/logs/stderr" if "ERROR" in ln else "projects/p/logs/stdout",
                "receiveTimestamp": datetime.fromtimestamp(t0 + i + 2, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "resource": {"labels": {"cluster_name": "c", "container_name": "vllm", "namespace_name": "default",
                                        "pod_name": "vllm-0"}, "type": "k8s_container"},
                "severity": "ERROR" if "ERROR" in ln else "INFO", "textPayload": ln + "\n",
                "timestamp": datetime.fromtimestamp(t0 + i, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.123456789Z")}
               for i, ln in enumerate(lines)]
    return json.dumps(entries[::-1] if shape == "gcp-newest-first" else entries, indent=2)
