"""The recorder on Kubernetes evidence: events, pod status, kubectl tables and describe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.bundle import read_bundle
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA
from tests.unit.record_helpers import _export

_EVENT = {"apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": "{reason}", "count": 3,
          "message": "{message}", "involvedObject": {"kind": "Pod", "name": "vllm-0", "namespace": "serving"},
          "metadata": {"name": "vllm-0.17c", "namespace": "serving", "creationTimestamp": "2025-05-01T10:00:00Z"},
          "firstTimestamp": "2025-05-01T10:00:00Z", "lastTimestamp": "{t}"}


def _event(reason: str, message: str, t: str) -> dict:
    return json.loads(json.dumps(_EVENT).replace("{reason}", reason).replace("{message}", message).replace("{t}", t))


def test_k8s_events_in_every_shape_kubectl_writes(tmp_path: Path) -> None:
    """`kubectl get events -w -o json` streams objects one after another (no list around them), `kubectl
    get event X -o json` is one Event, `-o yaml` of several objects has '---' between documents, and
    events.k8s.io/v1 says note/regarding/series: all are events at their times (they were refused as
    invalid JSON/YAML, or read as a pod with no statuses)."""
    a = _event("OOMKilling", "Memory cgroup out of memory: Killed process 4242 (python3)", "2025-05-01T10:05:00Z")
    b = _event("BackOff", "Back-off restarting failed container vllm", "2025-05-01T10:06:00Z")
    (tmp_path / "watch.json").write_text(json.dumps(a, indent=4) + "\n" + json.dumps(b, indent=4) + "\n")
    (tmp_path / "one.json").write_text(json.dumps(a))
    v1 = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "type": "Warning", "reason": "FailedScheduling",
          "note": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.", "eventTime": "2025-05-01T10:07:00.123456Z",
          "regarding": {"kind": "Pod", "name": "vllm-1"}, "series": {"count": 5, "lastObservedTime": "2025-05-01T10:08:00Z"},
          "metadata": {"name": "vllm-1.1", "creationTimestamp": "2025-05-01T10:07:00Z"}}
    import yaml
    (tmp_path / "events.yaml").write_text(yaml.safe_dump(a) + "---\n" + yaml.safe_dump(v1))
    for name, want in (("watch.json", ["OOMKilling", "BackOff"]), ("one.json", ["OOMKilling"]),
                       ("events.yaml", ["OOMKilling", "FailedScheduling"])):
        reps, _ = record([tmp_path / name], tmp_path / f"b-{name}", RecordOptions())
        evs = [e for e in read_bundle(tmp_path / f"b-{name}").events if e["kind"] in ("k8s_event", "host_oom_killed")]
        assert reps[0].kind == "k8s-events" and reps[0].quarantined == 0, name
        assert [e["reason"] for e in evs] == want and all(e["t_us"] is not None for e in evs), name
        # (node-problem-detector's OOMKilling reports the kernel's OOM kill: the kernel log's fact)
        assert [(e["kind"], e.get("pid")) for e in evs if e["reason"] == "OOMKilling"] == [("host_oom_killed", 4242)]
    evs = [e for e in read_bundle(tmp_path / "b-events.yaml").events if e["kind"] in ("k8s_event", "host_oom_killed")]
    assert evs[1]["message"].startswith("0/4 nodes") and evs[1]["object"] == "Pod/vllm-1" and evs[1]["count"] == 5



def test_event_exporter_json_lines_without_kind(tmp_path: Path) -> None:
    """GIVEN an event exporter's JSON lines (an event a line, no 'kind': kubernetes-event-exporter's
    shape) THEN each is an event at its time, node-problem-detector's OOMKilling a host OOM kill with
    its pid and the analysis says so; the file's line count is its lines. A pod evicted for the node's
    memory is killed for host memory too."""
    from replay.analysis.pipeline import analyze_bundle
    a = {k: v for k, v in _event("OOMKilling", "Memory cgroup out of memory: Killed process 2214 (python3) total-vm:1234kB, "
                                 "anon-rss:98765kB", "2025-03-01T10:05:01Z").items() if k not in ("kind", "apiVersion")}
    b = {k: v for k, v in _event("BackOff", "Back-off restarting failed container vllm", "2025-03-01T10:05:03Z").items()
         if k not in ("kind", "apiVersion")}
    (tmp_path / "events.jsonl").write_text(json.dumps(a) + "\n" + json.dumps(b) + "\n")
    reps, _ = record([tmp_path / "events.jsonl"], tmp_path / "b", RecordOptions())
    bundle = read_bundle(tmp_path / "b")
    assert (reps[0].kind, reps[0].lines, reps[0].parsed, reps[0].quarantined) == ("k8s-events", 2, 2, 0)
    kinds = [(e["kind"], e.get("reason"), e["t_us"]) for e in bundle.events]
    assert kinds == [("host_oom_killed", "OOMKilling", 0), ("k8s_event", "BackOff", 2_000_000)]
    oom = bundle.events[0]
    assert oom["pid"] == 2214 and oom["cgroup"] is True and oom["anon_rss_bytes"] == 98765 * 1024
    assert any(f.id == "oom:host" for f in analyze_bundle(bundle).findings)
    ev = _event("Evicted", "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. "
                "Container vllm was using 61Gi, request is 0, has larger consumption of memory.", "2025-03-01T10:05:09Z")
    (tmp_path / "evicted.json").write_text(json.dumps(ev))
    record([tmp_path / "evicted.json"], tmp_path / "e", RecordOptions())
    (got,) = read_bundle(tmp_path / "e").events
    assert (got["kind"], got["reason"], got["container"], got["used"]) == ("host_oom_killed", "Evicted", "vllm", "61Gi")


def test_gke_events_from_cloud_logging(tmp_path: Path) -> None:
    """GIVEN a GKE cluster's events as Google Cloud Logging exports them (`gcloud logging read
    'logName:"logs/events"' --format=json`: each Event in an entry's jsonPayload, newest first; the
    API server itself forgets events after an hour, so a postmortem has only these) WHEN recorded
    THEN they are the events at their times, as `kubectl get events -o json` gives them (they were
    quarantined as a Kubernetes object without events)."""
    a = _event("OOMKilling", "Memory cgroup out of memory: Killed process 4242 (python3)", "2025-05-01T10:05:00Z")
    b = _event("BackOff", "Back-off restarting failed container vllm", "2025-05-01T10:06:00Z")
    entries = [{"insertId": f"{i:x}", "jsonPayload": ev, "logName": "projects/p/logs/events",
                "receiveTimestamp": ev["lastTimestamp"], "resource": {"labels": {"cluster_name": "c"}, "type": "k8s_cluster"},
                "severity": "WARNING", "timestamp": ev["lastTimestamp"]} for i, ev in enumerate([b, a])]
    (tmp_path / "gke-events.json").write_text(json.dumps(entries, indent=2))
    (tmp_path / "events.json").write_text(json.dumps({"kind": "EventList", "items": [a, b]}))
    got = []
    for name in ("gke-events.json", "events.json"):
        reps, _ = record([tmp_path / name], tmp_path / f"b-{name}", RecordOptions())
        b_ = read_bundle(tmp_path / f"b-{name}")
        assert reps[0].kind == "k8s-events" and reps[0].quarantined == 0, name
        got.append(sorted((b_.meta.t0_utc, e["t_us"], e["reason"], e["message"]) for e in b_.events
                          if e["kind"] in ("k8s_event", "host_oom_killed")))
    assert got[0] == got[1] and len(got[0]) == 2

# `kubectl get events` as printed: plain (and `kubectl events`), -A, -o wide, and kubectl before 1.17
EVENTS_TABLES = {
    "plain": """LAST SEEN   TYPE      REASON       OBJECT                     MESSAGE
12m         Normal    Scheduled    pod/vllm-0                 Successfully assigned default/vllm-0 to gpu-node-1
3m12s       Warning   BackOff      pod/vllm-0                 Back-off restarting failed container vllm in pod vllm-0
90s         Warning   OOMKilling   node/gpu-node-1            Memory cgroup out of memory: Killed process 4242 (python3)
""",
    "all-namespaces": """NAMESPACE   LAST SEEN   TYPE      REASON       OBJECT            MESSAGE
serving     12m         Normal    Scheduled    pod/vllm-0        Successfully assigned serving/vllm-0 to gpu-node-1
serving     3m12s       Warning   BackOff      pod/vllm-0        Back-off restarting failed container vllm in pod vllm-0
default     90s         Warning   OOMKilling   node/gpu-node-1   Memory cgroup out of memory: Killed process 4242 (python3)
""",
    "wide": """LAST SEEN   TYPE      REASON       OBJECT            SUBOBJECT              SOURCE                MESSAGE                                                      FIRST SEEN   COUNT   NAME
12m         Normal    Scheduled    pod/vllm-0                               default-scheduler     Successfully assigned default/vllm-0 to gpu-node-1           12m          1       vllm-0.17a
3m12s       Warning   BackOff      pod/vllm-0        spec.containers{vllm}  kubelet, gpu-node-1   Back-off restarting failed container vllm in pod vllm-0      10m          7       vllm-0.17b
90s         Warning   OOMKilling   node/gpu-node-1                          kernel-monitor        Memory cgroup out of memory: Killed process 4242 (python3)   90s          1       gpu-node-1.17c
""",
    "old kubectl": """LAST SEEN   FIRST SEEN   COUNT     NAME          KIND   SUBOBJECT               TYPE      REASON       SOURCE              MESSAGE
12m         12m          1         vllm-0.17a    Pod                            Normal    Scheduled    default-scheduler   Successfully assigned default/vllm-0 to gpu-node-1
3m          10m          7         vllm-0.17b    Pod    spec.containers{vllm}   Warning   BackOff      kubelet, gpu-node   Back-off restarting failed container
1m          1m           1         gpu-node-1    Node                           Warning   OOMKilling   kernel-monitor      Memory cgroup out of memory: Killed process 4242 (python3)
""",
}


@pytest.mark.parametrize("shape", list(EVENTS_TABLES))
def test_kubectl_events_table_in_every_shape(shape: str, tmp_path: Path) -> None:
    """`kubectl get events` pasted as its table (it was taken for a vLLM log: every row was lost) is
    read column by column, in each shape kubectl prints: reason, type, object, message, count; with
    --at the ages place the events, without it a note says how."""
    src = tmp_path / "events.txt"
    src.write_text(EVENTS_TABLES[shape] + "this line is no row\n")
    reps, _ = record([src], tmp_path / "b", RecordOptions(at="2024-05-01T12:00:00Z"))
    assert reps[0].kind == "k8s-table"
    ev = [e for e in read_bundle(tmp_path / "b").events if e["kind"] in ("k8s_event", "host_oom_killed")]
    assert [e["reason"] for e in ev] == ["Scheduled", "BackOff", "OOMKilling"]
    assert ev[2]["kind"] == "host_oom_killed" and ev[2]["pid"] == 4242  # (the kernel's OOM kill, as reported)
    assert [e["type"] for e in ev] == ["Normal", "Warning", "Warning"]
    assert ev[2]["message"] == "Memory cgroup out of memory: Killed process 4242 (python3)"
    assert ev[1]["message"].startswith("Back-off restarting failed container")
    assert (ev[2]["t_us"] - ev[0]["t_us"]) / 1e6 == {"old kubectl": 660}.get(shape, 630)  # 12m - 90s (old: 1m)
    assert ev[1]["count"] == (7 if shape in ("wide", "old kubectl") else None)
    assert ev[0]["object"] in ("pod/vllm-0", "vllm-0.17a") and reps[0].quarantined == 1
    reps, _ = record([src], tmp_path / "c", RecordOptions())
    assert any("pass --at" in n for n in reps[0].notes)


PODS_TABLES = {  # `kubectl get pods` as printed: plain, -o wide, -A
    "plain": """NAME                     READY   STATUS             RESTARTS       AGE
vllm-7d9f8b6c5d-x2kqp    0/1     OOMKilled          3 (45s ago)    10m
vllm-7d9f8b6c5d-abcde    1/1     Running            0              10m
vllm-7d9f8b6c5d-zzzzz    0/1     CrashLoopBackOff   5 (2m10s ago)  10m
""",
    "wide": """NAME                     READY   STATUS             RESTARTS       AGE   IP            NODE         NOMINATED NODE   READINESS GATES
vllm-7d9f8b6c5d-x2kqp    0/1     OOMKilled          3 (45s ago)    10m   10.0.0.12     gpu-node-1   <none>           <none>
vllm-7d9f8b6c5d-abcde    1/1     Running            0              10m   10.0.0.13     gpu-node-1   <none>           <none>
vllm-7d9f8b6c5d-zzzzz    0/1     CrashLoopBackOff   5 (2m10s ago)  10m   10.0.0.14     gpu-node-2   <none>           <none>
""",
    # as a chat tool or an editor leaves a paste: columns no longer under their names, or tabs
    "misaligned": """NAME                     READY   STATUS             RESTARTS       AGE
vllm-7d9f8b6c5d-x2kqp  0/1   OOMKilled   3 (45s ago)   10m
vllm-7d9f8b6c5d-abcde\t1/1\tRunning\t0\t10m
vllm-7d9f8b6c5d-zzzzz    0/1     CrashLoopBackOff   5 (2m10s ago)  10m
""",
    "all-namespaces": """NAMESPACE   NAME                     READY   STATUS             RESTARTS       AGE
serving     vllm-7d9f8b6c5d-x2kqp    0/1     OOMKilled          3 (45s ago)    10m
serving     vllm-7d9f8b6c5d-abcde    1/1     Running            0              10m
serving     vllm-7d9f8b6c5d-zzzzz    0/1     CrashLoopBackOff   5 (2m10s ago)  10m
""",
}


@pytest.mark.parametrize("shape", list(PODS_TABLES))
def test_kubectl_pods_table_gives_states_and_the_host_oom_kill(shape: str, tmp_path: Path) -> None:
    """`kubectl get pods` pasted as its table (it was quarantined whole as a vLLM log): each pod's
    status and restarts as of --at, and a pod OOMKilled there is a host OOM kill, which the analysis
    reports as one (not a CUDA OOM)."""
    from replay.analysis.pipeline import analyze_bundle
    src = tmp_path / "pods.txt"
    src.write_text(PODS_TABLES[shape])
    reps, _ = record([src], tmp_path / "b", RecordOptions(at="2024-05-01T12:00:00Z"))
    assert reps[0].kind == "k8s-table" and reps[0].quarantined == 0
    b = read_bundle(tmp_path / "b")
    st = [e for e in b.events if e["kind"] == "k8s_pod_status"]
    assert [(e["status"], e["restart_count"], e["last_restart_ago_s"]) for e in st] == [
        ("OOMKilled", 3, 45), ("Running", 0, None), ("CrashLoopBackOff", 5, 130)]
    kill = [e for e in b.events if e["kind"] == "host_oom_killed"]
    assert len(kill) == 1 and kill[0]["container"] == "vllm-7d9f8b6c5d-x2kqp" and "within 45 s" in kill[0]["seen"]
    assert kill[0]["exit_code"] is None  # (a table states no exit code)
    assert any(f.id == "oom:host" for f in analyze_bundle(b).findings)


def test_describe_pod_oomkilled_with_its_time(tmp_path: Path) -> None:
    """`kubectl describe pod`: a container terminated OOMKilled (State or Last State) is a host OOM kill
    at its Finished time, naming the container; events are placed at --at minus their age."""
    reps, _ = record([DATA / "describe_pod_oomkilled_init.txt"], tmp_path / "a", RecordOptions())
    ev = [e for e in read_bundle(tmp_path / "a").events if e["kind"] == "host_oom_killed"]
    assert reps[0].kind == "k8s-describe" and len(ev) == 1
    assert ev[0]["container"] == "init" and ev[0]["exit_code"] == 137 and ev[0]["t_us"] == 0
    assert read_bundle(tmp_path / "a").meta.t0_utc.startswith("2024-02-16T15:22:17")
    reps, _ = record([DATA / "describe_pod_events_kubelet.txt"], tmp_path / "b", RecordOptions(at="2025-05-01T10:00:00Z"))
    evs = {e["reason"]: e["t_us"] for e in read_bundle(tmp_path / "b").events if e["kind"] == "k8s_event"}
    # ages 18m (Scheduled) and 4m53s (BackOff, 'x72 over 20m': the age is the last time)
    assert evs["BackOff"] - evs["Scheduled"] == (18 * 60 - (4 * 60 + 53)) * 1_000_000
    assert any("--at minus their ages" in n for n in reps[0].notes)


def test_cloud_logging_export_of_kubernetes_events_is_not_a_log() -> None:
    """A Cloud Logging export of Kubernetes events (their involvedObject in jsonPayload) is left to the
    events reader; an array of other JSON objects, or a query_range export, is not a cloud log."""
    from replay.record.recorder import detect_kind
    events = json.dumps([{"insertId": "1", "logName": "projects/p/logs/events", "jsonPayload": {
        "involvedObject": {"kind": "Pod", "name": "vllm-0"}, "reason": "OOMKilling", "kind": "Event"}}], indent=2)
    assert detect_kind(events) != "log-export"
    assert detect_kind(json.dumps([{"a": 1, "textPayload": "x"}])) != "log-export"  # (no LogEntry keys)
    assert detect_kind(_export(["INFO 05-19 10:00:00 [x.py:1] hello"], "gcp-oldest-first")) == "log-export"
    assert detect_kind(_export(["INFO 05-19 10:00:00 [x.py:1] hello"], "aws")) == "log-export"


def test_a_containers_terminated_state_pasted_alone_is_a_describe(tmp_path: Path) -> None:
    # GIVEN only a container's 'Last State: Terminated' block of `kubectl describe pod` (a real paste,
    # its first line unindented: it was of no known kind and every line quarantined)
    reps, _ = record([DATA / "describe_last_state_alone.txt"], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    # THEN it is a host OOM kill at its Finished time (+0200 read as such)
    assert (reps[0].kind, reps[0].parsed, reps[0].quarantined) == ("k8s-describe", 5, 0)
    assert [(e["kind"], e["reason"], e["exit_code"], e["source"]) for e in b.events] == [
        ("host_oom_killed", "OOMKilled", 137, "describe_last_state_alone.txt:1")]
    assert b.meta.t0_utc.startswith("2023-09-15T07:56:17")


def test_exit_137_without_oomkilled_is_a_sigkill_not_a_host_oom(tmp_path: Path) -> None:
    """A container that ended with exit 137 under reason 'Error' (the lastState of Kubernetes issue
    53669: a node-level OOM kill the kubelet did not name) was recorded as a host OOM kill 'OOMKilled,
    exit 137'. SIGKILL has other causes (a kill after a failed liveness probe's grace period): it is
    a container killed, with what it may mean, an outage and a finding of medium confidence; the
    reason OOMKilled stays a host OOM kill whatever its exit code (0 in Kubernetes issue 131530)."""
    from replay.analysis.outages import outages
    from replay.analysis.pipeline import analyze_bundle
    term = {"containerID": "docker://5954f621c17f13706c25a215db06fe2bf7b9a9a6c732a909eb0db39d62346724", "exitCode": 137,
            "finishedAt": "2017-10-10T17:41:58Z", "reason": "Error", "startedAt": "2017-10-10T17:20:37Z"}
    pod = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "memtest", "namespace": "default"},
           "status": {"containerStatuses": [{"name": "memtest", "restartCount": 1, "lastState": {"terminated": term}}]}}
    (tmp_path / "pod.json").write_text(json.dumps(pod, indent=4))
    record([tmp_path / "pod.json"], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    killed = [e for e in b.events if e["kind"] in ("container_killed", "host_oom_killed")]
    assert [(e["kind"], e["reason"], e["exit_code"]) for e in killed] == [("container_killed", "Error", 137)]
    assert "liveness probe" in killed[0]["meaning"] and len(outages(b.events)) == 1
    ids = {f.id for f in analyze_bundle(b).findings}
    assert "killed:sigkill" in ids and "oom:host" not in ids
    from replay.report.postmortem import render_postmortem
    assert "The container was killed with SIGKILL (exit 137; Kubernetes did not say OOMKilled) at 2017-10-10 17:41:58 UTC." in (
        render_postmortem(tmp_path / "b"))
    (tmp_path / "d.txt").write_text("Name:         memtest\nContainers:\n  memtest:\n    State:          Terminated\n"
                                    "      Reason:       OOMKilled\n      Exit Code:    0\n"
                                    "      Finished:     Tue, 29 Apr 2025 14:10:51 +0800\n    Ready:          False\n")
    record([tmp_path / "d.txt"], tmp_path / "c", RecordOptions())
    assert [(e["kind"], e["exit_code"]) for e in read_bundle(tmp_path / "c").events] == [("host_oom_killed", 0)]


def test_a_container_killed_for_a_failed_liveness_probe_is_said_so(tmp_path: Path) -> None:
    """GIVEN the kubelet's events of a liveness kill (a describe's Events, real: 'Liveness probe failed:
    HTTP probe failed with statuscode: 500', then 'Container app-container failed liveness probe, will be
    restarted'), with the container's lastState 'Error, exit 137' THEN the kill is a container killed for
    its probe, an outage at the kill's time; the exit 137 is that kill, not a SIGKILL of unstated cause;
    the finding is high and quotes the probe's failure; the postmortem names it."""
    from replay.analysis.outages import outages
    from replay.analysis.pipeline import analyze_bundle
    from replay.report.postmortem import render_postmortem
    events = (DATA / "describe_events_liveness_kill.txt").read_text()
    (tmp_path / "d.txt").write_text(
        "Name:             app-deployment-6786b5648d-757bq\nContainers:\n  app-container:\n    State:          Running\n"
        "    Last State:     Terminated\n      Reason:       Error\n      Exit Code:    137\n"
        "      Finished:     Sun, 01 Jun 2025 11:59:00 +0000\n    Restart Count:  1\n" + events)
    record([tmp_path / "d.txt"], tmp_path / "b", RecordOptions(at="2025-06-01T12:00:00Z"))
    b = read_bundle(tmp_path / "b")
    kills = [(e.get("probe"), e["container"], e["source"]) for e in b.events if e["kind"] == "container_killed"]
    assert kills == [(None, "app-container", "d.txt:5"), ("liveness", "app-container", "d.txt:16")]
    assert [o.down_us for o in outages(b.events)] == [min(e["t_us"] for e in b.events if e["kind"] == "container_killed")]
    found = {f.id: f for f in analyze_bundle(b).findings}
    assert "killed:sigkill" not in found
    f = found["killed:liveness_probe"]
    assert f.confidence == "high" and "HTTP probe failed with statuscode: 500" in f.detail and "startupProbe" in f.detail
    assert {e["source"] for e in f.evidence} == {"d.txt:5", "d.txt:16"}
    assert "The kubelet killed the container, its liveness probe failed (not an OOM), at 2025-06-01 11:59:00 UTC" in (
        render_postmortem(tmp_path / "b"))
    (tmp_path / "e.txt").write_text(events)  # (the events alone: the kill is the outage, as the kubelet says it)
    record([tmp_path / "e.txt"], tmp_path / "c", RecordOptions(at="2025-06-01T12:00:00Z"))
    assert [f.id for f in analyze_bundle(read_bundle(tmp_path / "c")).findings] == ["killed:liveness_probe"]


def test_a_pod_evicted_for_the_nodes_disk_is_said_so(tmp_path: Path) -> None:
    """GIVEN evictions for the node's disk, not its memory: a pod's own status (concourse/hush-house issue 8:
    'reason: Evicted', 'The node was low on resource: ephemeral-storage. Container hush-house-worker was using
    73712Ki, which exceeds its request of 0.'), the kubelet's event of one (GoogleCloudPlatform/kubernetes-
    engine-samples issue 1581, a 70B model downloading into the container), and a describe of that pod whose
    container is 'ContainerStatusUnknown', exit 137, at Go's zero time THEN the pod YAML is read as Kubernetes
    (every line was quarantined as a log), each eviction is a container killed for ephemeral-storage and an
    outage, the exit 137 is that eviction's (its zero time no impossible time), and the finding says to give
    the model a volume of its own; the describe's header alone (its events expired) still says the eviction."""
    from replay.analysis.pipeline import analyze_bundle
    from replay.report.postmortem import render_postmortem
    (tmp_path / "pod.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hush-house-worker-0\nstatus:\n"
        "  message: 'The node was low on resource: ephemeral-storage. Container hush-house-worker\n"
        "    was using 73712Ki, which exceeds its request of 0. '\n  phase: Failed\n  reason: Evicted\n"
        '  startTime: "2019-02-15T20:18:59Z"\n')
    record([tmp_path / "pod.yaml"], tmp_path / "a", RecordOptions())
    a = read_bundle(tmp_path / "a")
    assert [(f["kind"], f["quarantined"]) for f in a.meta.inputs] == [("k8s-pod", 0)]
    assert [(e["kind"], e["evicted"], e["container"]) for e in a.events] == [
        ("container_killed", "ephemeral-storage", "hush-house-worker")]
    assert [f.id for f in analyze_bundle(a).findings] == ["killed:evicted:ephemeral-storage"]
    message = ("The node was low on resource: ephemeral-storage. Threshold quantity: 10120387530, available: 9166736Ki. "
               "Container llm was using 57900024Ki, request is 0, has larger consumption of ephemeral-storage. ")
    (tmp_path / "d.txt").write_text(
        "Name:             llm-689555d8bf-62gjd\nNamespace:        default\nStatus:           Failed\nReason:           Evicted\n"
        "Containers:\n  llm:\n    State:          Terminated\n      Reason:       ContainerStatusUnknown\n"
        "      Exit Code:    137\n      Started:      Mon, 01 Jan 0001 00:00:00 +0000\n"
        "      Finished:     Mon, 01 Jan 0001 00:00:00 +0000\n    Ready:          False\nEvents:\n"
        "  Type     Reason   Age   From     Message\n  ----     ------   ----  ----     -------\n"
        f"  Warning  Evicted  5m    kubelet  {message.strip()}\n")
    (tmp_path / "ev.json").write_text(json.dumps({
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "llm.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "llm-689555d8bf-62gjd"}, "reason": "Evicted", "message": message,
        "type": "Warning", "lastTimestamp": "2025-01-03T19:20:00Z", "count": 1}))
    record([tmp_path / "ev.json", tmp_path / "d.txt"], tmp_path / "b", RecordOptions(at="2025-01-03T19:25:00Z"))
    b = read_bundle(tmp_path / "b")
    assert not (tmp_path / "b" / "quarantine.jsonl").read_text().strip()
    kills = sorted((e["source"], e.get("evicted"), e["t_us"]) for e in b.events if e["kind"] == "container_killed")
    assert kills == [("d.txt:16", "ephemeral-storage", 0), ("d.txt:7", None, None), ("ev.json", "ephemeral-storage", 0)]
    found = analyze_bundle(b).findings
    assert [(f.id, f.confidence) for f in found] == [("killed:evicted:ephemeral-storage", "high")]
    assert "57900024Ki" in found[0].detail and "a volume of its own" in found[0].detail and len(found[0].evidence) == 3
    (tmp_path / "h.txt").write_text("\n".join(ln for ln in (tmp_path / "d.txt").read_text().splitlines()[:12])
                                    .replace("Status:           Failed\n", "Status:           Failed\nMessage:          "
                                             + message.strip() + "\n") + "\n")  # (its events expired: the header alone)
    record([tmp_path / "h.txt"], tmp_path / "c", RecordOptions())
    assert [(e["kind"], e.get("evicted"), e["source"]) for e in read_bundle(tmp_path / "c").events] == [
        ("container_killed", None, "h.txt:8"), ("container_killed", "ephemeral-storage", "h.txt:5")]
    assert "The kubelet evicted the pod, the node low on ephemeral-storage (not an OOM), at 2025-01-03 19:20:00 UTC" in (
        render_postmortem(tmp_path / "b"))


def test_an_events_table_row_out_of_line_with_its_header_keeps_its_object(tmp_path: Path) -> None:
    """GIVEN a 'kubectl get events' row pasted with fewer spaces than its header's columns, so that the
    header's MESSAGE column starts after a space inside the message THEN its cells are its own: the
    object is the pod, the message is whole (it took the message's first word into the object)."""
    row = ('2m          Warning   Unhealthy   pod/vllm-7d9f8-abcde   Liveness probe failed: Get '
           '"http://10.244.0.163:8000/health": dial tcp 10.244.0.163:8000: connect: connection refused')
    (tmp_path / "ev.txt").write_text("LAST SEEN   TYPE      REASON      OBJECT                          MESSAGE\n" + row + "\n")
    record([tmp_path / "ev.txt"], tmp_path / "b", RecordOptions(at="2025-06-01T12:00:00Z"))
    [e] = read_bundle(tmp_path / "b").events
    assert (e["object"], e["message"][:21]) == ("pod/vllm-7d9f8-abcde", "Liveness probe failed")


def test_kubernetes_yaml_with_a_time_out_of_range_keeps_the_rest(tmp_path: Path) -> None:
    """A pod's YAML whose one time cannot be a time (hour 25, as a hand edit or a broken export leaves
    it): the YAML reader turned unquoted times into datetimes and raised on it, which ended the record
    with an internal error. Times are now read as text, as JSON's are: the pod's OOMKilled state is
    kept, and its time is what the broken one says: none."""
    text = (DATA / "pod_laststate_oomkilled.yaml").read_text()
    assert "finishedAt: 2017-06-20T20:52:19Z" in text
    broken = tmp_path / "pod.yaml"
    broken.write_text(text.replace("finishedAt: 2017-06-20T20:52:19Z", "finishedAt: 2017-06-20T25:52:19Z"))
    record([DATA / "pod_laststate_oomkilled.yaml"], tmp_path / "good", RecordOptions())
    record([broken], tmp_path / "b", RecordOptions())
    good = [e for e in read_bundle(tmp_path / "good").events if e["kind"] == "host_oom_killed"]
    ev = [e for e in read_bundle(tmp_path / "b").events if e["kind"] == "host_oom_killed"]
    assert good and good[0]["t_us"] is not None  # (the unbroken file's time is read, as before)
    assert len(ev) == len(good) and ev[0]["exit_code"] == 137 and ev[0]["t_us"] is None
