"""Kubernetes: events and pod status as YAML or JSON, `kubectl get` tables and `kubectl describe`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from replay.record.common import Parsed, Parser, as_list, as_obj, parse_time
from replay.record.events import EventKind, ParsedEvent
from replay.record.kernel import K_OOM, host_oom
from replay.record.options import RecordOptions
from replay.units import is_uint

# --- Kubernetes ----------------------------------------------------------------------------------
OOMKILLED_MEANING = ("the container was killed for host/cgroup memory (OOMKilled, exit 137); "
                     "a CUDA OOM is an application error and does not show up as OOMKilled")
SIGKILL_MEANING = ("the container was killed with SIGKILL (exit 137) and Kubernetes did not say OOMKilled: the "
                   "node's kernel OOM killer outside the container's cgroup (a host OOM the kubelet does not name), "
                   "or a kill after the grace period (a failed liveness probe, an eviction, a delete); the node's "
                   "kernel log ('Out of memory: Killed process') tells which. A CUDA OOM exits on its own, not with 137")


def terminated_kind(reason: Any, exit_code: Any) -> tuple[EventKind, str | None]:
    """The event of a terminated container: a host OOM kill where Kubernetes says OOMKilled (whatever
    the exit code), a SIGKILL of unstated cause for exit 137 under another reason ('Error'), else a
    plain termination."""
    if reason == "OOMKilled":
        return "host_oom_killed", OOMKILLED_MEANING
    if exit_code == 137:
        return "container_killed", SIGKILL_MEANING
    return "container_terminated", None


def _walk_container_statuses(obj: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if isinstance(obj, dict):
        if "lastState" in obj or "state" in obj and "restartCount" in obj:
            out.append(obj)
        for v in obj.values():
            out += _walk_container_statuses(v)
    elif isinstance(obj, list):
        for v in obj:
            out += _walk_container_statuses(v)
    return out


def _walk_pods(obj: Any) -> list[dict[str, Any]]:
    """The Pods in a Kubernetes document (a list's items among them)."""
    if isinstance(obj, list):
        return [p for o in obj for p in _walk_pods(o)]
    if isinstance(obj, dict):
        if obj.get("kind") == "Pod" or "kind" not in obj and isinstance(obj.get("status"), dict) and "phase" in obj["status"]:
            return [obj]
        return [p for o in as_list(obj.get("items")) for p in _walk_pods(o)]
    return []


class _YamlLoader(yaml.SafeLoader):  # type: ignore[misc]  # (PyYAML is untyped here)
    """YAML's safe loader, with times left as the text they are: the readers parse them as they parse
    JSON's, and a time out of range ('hour 25') is then an unreadable time, not a file that cannot be read."""


_YamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def _k8s_documents(text: str) -> list[Any]:
    """Every object in the text: one JSON value, JSON objects one after another (what
    ``kubectl get events -w -o json`` streams), or YAML documents ('---' between them)."""
    if not text.lstrip().startswith(("{", "[")):
        return [d for d in yaml.load_all(text, Loader=_YamlLoader) if d is not None]
    dec, i = json.JSONDecoder(), 0
    docs: list[Any] = []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        obj, i = dec.raw_decode(text, i)
        docs.append(obj)


def _is_event(o: Any) -> bool:
    """A Kubernetes Event: by its kind, or, where an exporter leaves the kind out (an event exporter's
    JSON lines), by what only an event has: the object it is about and a reason."""
    return isinstance(o, dict) and (o.get("kind") == "Event" or "kind" not in o and "reason" in o and (
        isinstance(o.get("involvedObject"), dict) or isinstance(o.get("regarding"), dict)))


def _k8s_event(ev: dict[str, Any]) -> ParsedEvent:
    """A core/v1 Event, or an events.k8s.io/v1 one ('note', 'regarding', 'series'), as a bundle event."""
    t = None
    for k in ("lastTimestamp", "eventTime", "deprecatedLastTimestamp", "firstTimestamp"):
        if ev.get(k):
            t = parse_time(str(ev[k]))
            break
    series, meta = as_obj(ev.get("series")), as_obj(ev.get("metadata"))
    if t is None and series.get("lastObservedTime"):
        t = parse_time(str(series["lastObservedTime"]))
    if t is None and meta.get("creationTimestamp"):
        t = parse_time(str(meta["creationTimestamp"]))
    inv = as_obj(ev.get("involvedObject") or ev.get("regarding"))
    count = ev.get("count") or ev.get("deprecatedCount") or series.get("count")
    return _k8s_fact(t, None, {"reason": ev.get("reason"), "type": ev.get("type"),
                               "message": ev.get("message") or ev.get("note"),
                               "object": f"{inv.get('kind')}/{inv.get('name')}", "count": count})


def _k8s_fact(t: int | None, line: int | None, data: dict[str, Any]) -> ParsedEvent:
    """A Kubernetes event as a bundle event: a k8s_event, except node-problem-detector's OOMKilling,
    which reports the kernel's OOM kill on the node and is the kernel log's fact (a host OOM kill,
    with its pid, process and memory), its event fields kept beside."""
    message = str(data.get("message") or "")
    oom = K_OOM.search(message) if data.get("reason") == "OOMKilling" else None
    if oom:
        return {"t": t, "kind": "host_oom_killed", "line": line, "data": data | host_oom(oom, message)}
    ev = _EVICTED.search(message) if data.get("reason") == "Evicted" else None
    if ev and ev["resource"] == "memory":  # the kubelet evicted the pod for the node's memory: killed for host memory too
        return {"t": t, "kind": "host_oom_killed", "line": line, "data": data | {
            "container": ev["container"], "used": ev["used"], "text": message.strip()[:300],
            "meaning": "the kubelet evicted the pod because the node ran low on memory (host memory, not the GPU's); "
                       "a CUDA OOM is an application error and never shows up here"}}
    if data.get("reason") == "Evicted":  # (for the node's disk, its inodes, its process ids: no memory at all)
        res = ev["resource"] if ev else None
        return {"t": t, "kind": "container_killed", "line": line, "data": data | {
            "container": ev["container"] if ev else None, "used": ev["used"] if ev else None, "evicted": res or "unstated",
            "text": message.strip()[:300],
            "meaning": f"the kubelet evicted the pod because the node ran low on {res or 'a resource it does not name'}"
                       + (" (its disk: model weights downloaded into the container, logs, compile caches)"
                          if res == "ephemeral-storage" else "") + ", which is no memory and no OOM"}}
    kill = _PROBE_KILL.search(message) if data.get("reason") == "Killing" else None
    if kill:  # the kubelet killed the container for a failed probe: SIGKILL after the grace period
        return {"t": t, "kind": "container_killed", "line": line, "data": data | {
            "container": kill["container"], "probe": kill["probe"], "meaning": PROBE_KILL_MEANING.format(kill["probe"])}}
    return {"t": t, "kind": "k8s_event", "line": line, "data": data}


# the kubelet's kill of a container whose liveness (or startup) probe failed ('Container vllm failed
# liveness probe, will be restarted', reason Killing)
_PROBE_KILL = re.compile(r"Container (?P<container>\S+) failed (?P<probe>liveness|startup) probe")
PROBE_KILL_MEANING = ("the kubelet killed the container because its {} probe failed (SIGKILL after the grace period, "
                      "exit 137): the engine did not answer its health check in time, which is no OOM")

# the kubelet's eviction for node memory pressure ('The node was low on resource: memory. … Container vllm
# was using 61Gi, request is 0, has larger consumption of memory.')
_EVICTED = re.compile(r"low on resource: (?P<resource>[\w.-]+)\.(?:.*?Container (?P<container>\S+)\s+was using (?P<used>\S+?),)?",
                      re.S)


def parse_k8s(path: Path, text: str) -> Parsed:
    """``kubectl get events`` (a list, a single event, or the stream ``-w -o json`` writes; core/v1
    and events.k8s.io/v1; or as Google Cloud Logging exports GKE's, each in an entry's jsonPayload)
    and ``kubectl get pod`` (lastState: OOMKilled/exit 137 vs a CUDA OOM), JSON or YAML."""
    p = Parsed(kind="k8s")
    p.lines = len(text.splitlines())
    try:
        docs = _k8s_documents(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        mark = getattr(e, "problem_mark", None)
        line = getattr(e, "lineno", None) or (mark.line + 1 if mark else None)
        p.quarantine.append((line, f"not valid JSON/YAML: {str(e).splitlines()[0]}", ""))
        return p
    objs: list[Any] = []
    for d in docs:  # lists of objects (EventList, PodList, List) stand for their items
        items = d.get("items") if isinstance(d, dict) and isinstance(d.get("items"), list) else None
        objs += items if items is not None else (d if isinstance(d, list) else [d])
    # Google Cloud Logging's entries stand for the object they carry (GKE keeps a cluster's events
    # there: the API server forgets them after an hour)
    objs = [o["jsonPayload"] if isinstance(o, dict) and isinstance(o.get("jsonPayload"), dict)
            and ("logName" in o or "insertId" in o) else o for o in objs]
    events = [o for o in objs if _is_event(o)]
    obj: Any = [o for o in objs if not _is_event(o)]
    if events:
        p.kind = "k8s-events"
        p.events += [_k8s_event(ev) for ev in events]
        p.parsed = p.lines
        if not obj:
            return p
    statuses = _walk_container_statuses(obj)
    p.kind = "k8s-pod" if not events else p.kind
    evicted = [o for o in _walk_pods(obj) if as_obj(o.get("status")).get("reason") == "Evicted"]
    for pod in evicted:  # (the pod's own status: what the kubelet's event said, kept where the event is gone)
        st = as_obj(pod.get("status"))
        seen = [str(c["lastTransitionTime"]) for c in as_list(st.get("conditions")) if as_obj(c).get("lastTransitionTime")]
        p.events.append(_k8s_fact(parse_time(max(seen)) if seen else None, None, {
            "reason": "Evicted", "message": st.get("message"), "object": f"Pod/{as_obj(pod.get('metadata')).get('name')}"}))
    for st in statuses:
        term = as_obj(as_obj(st.get("lastState")).get("terminated"))
        if term:
            reason = term.get("reason")
            code = term.get("exitCode")
            t = parse_time(str(term["finishedAt"])) if term.get("finishedAt") else None
            kind, meaning = terminated_kind(reason, code)
            p.events.append({"t": t, "kind": kind, "line": None, "data": {
                "container": st.get("name"), "reason": reason, "exit_code": code,
                "restart_count": st.get("restartCount"), "meaning": meaning}})
        if st.get("restartCount"):
            p.events.append({"t": None, "kind": "restart_count", "line": None,
                             "data": {"container": st.get("name"), "restart_count": st.get("restartCount")}})
    p.parsed = p.lines if statuses or events or evicted else 0  # (an evicted pod's status is read: not a pod without any)
    if not statuses and not events and not evicted:
        p.quarantine.append((None, "Kubernetes object without container statuses or events", ""))
    return p


DESCRIBE_TERMINATED = re.compile(r"^\s*(?:Last )?State:\s+Terminated\b")  # (how a container's ended state opens)
DESCRIBE_EV = re.compile(r"^\s+(Normal|Warning)\s+(\S+)\s+(\S+(?: \(x\d+ over \S+\))?)\s+(\S+(?:, \S+)*)\s+(.*)$")


_AGE = re.compile(r"(\d+)([dhms])")
_AGE_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def _age_s(age: str) -> int | None:
    """kubectl's ages ('45s', '4m53s', '3h45m', '2d3h') in seconds; None for '<unknown>' and the like."""
    parts = _AGE.findall(age)
    if not parts or "".join(n + u for n, u in parts) != age:
        return None
    return sum(int(n) * _AGE_S[u] for n, u in parts)


EVENTS_TABLE_HEADER = re.compile(r"^(?:NAMESPACE\s+)?LAST SEEN\s+(?:TYPE|FIRST SEEN)\s")
PODS_TABLE_HEADER = re.compile(r"^(?:NAMESPACE\s+)?NAME\s+READY\s+STATUS\s+RESTARTS\s+AGE\b")
_COLUMN = re.compile(r"[A-Z]+(?: (?:SEEN|NODE|GATES))?")  # (kubectl's two-word column names)
_RESTARTS = re.compile(r"^(\d+)(?: \((\w+) ago\))?$")


def _cells(ln: str, cols: list[tuple[str, int]]) -> dict[str, str]:
    """A table row's cells, cut where the header's names start; a row that does not line up with its
    header (a hand-edited paste, tabs turned to spaces) is split at runs of two or more spaces
    (or tabs) instead, when that gives one cell per column (kubectl pads columns with three: a cut
    after a single space is inside a cell, between a message's words say)."""
    cut = {name: ln[start:cols[k + 1][1] if k + 1 < len(cols) else None].strip() for k, (name, start) in enumerate(cols)}
    if all(start >= len(ln) or ln[start - 2:start] == "  " for _, start in cols[1:]):
        return cut
    parts = re.split(r"\s*\t\s*|\s{2,}", ln.strip(), maxsplit=len(cols) - 1)
    return dict(zip([c for c, _ in cols], parts, strict=True)) if len(parts) == len(cols) else cut


def parse_kubectl_table(path: Path, text: str, at: str | None = None, tz_offset_s: int = 0) -> Parsed:
    """``kubectl get events`` / ``kubectl events`` and ``kubectl get pods`` as the tables they print
    (plain, ``-A``, ``-o wide``, old kubectl's event columns), columns cut where the header's names
    start (kubectl pads them so). Event ages are placed at ``--at`` minus the age, as for ``kubectl
    describe``; a pod's status is what it was at ``--at``: OOMKilled there is a host OOM kill, seen
    by then (since its last restart, when the table says how long ago that was)."""
    p = Parsed(kind="k8s-table")
    lines = text.splitlines()
    p.lines = len(lines)
    taken = parse_time(at, tz_offset_s) if at else None
    cols: list[tuple[str, int]] = []
    pods = False
    for i, ln in enumerate(lines, start=1):
        if not ln.strip():
            p.parsed += 1
            continue
        if EVENTS_TABLE_HEADER.match(ln) or PODS_TABLE_HEADER.match(ln):  # (a header again: another listing)
            cols = [(m.group(0), m.start()) for m in _COLUMN.finditer(ln)]
            pods = bool(PODS_TABLE_HEADER.match(ln))
            p.parsed += 1
            continue
        if not cols:
            p.quarantine.append((i, "a row before the table's header", ln))
            continue
        row = _cells(ln, cols)
        if pods:
            m = _RESTARTS.match(row.get("RESTARTS", ""))
            if not row.get("NAME") or not row.get("STATUS") or not m:
                p.quarantine.append((i, "a pods row without its name, status or restarts", ln))
                continue
            restarts, ago = int(m.group(1)), _age_s(m.group(2)) if m.group(2) else None
            data = {"pod": row["NAME"], "namespace": row.get("NAMESPACE"), "ready": row.get("READY"),
                    "status": row["STATUS"], "restart_count": restarts, "last_restart_ago_s": ago, "age": row.get("AGE")}
            p.events.append({"t": taken, "kind": "k8s_pod_status", "line": i, "data": data})
            if "OOMKilled" in row["STATUS"]:
                p.events.append({"t": taken, "kind": "host_oom_killed", "line": i, "data": {
                    "container": row["NAME"], "reason": "OOMKilled", "exit_code": None, "restart_count": restarts,
                    "seen": "pod status at --at" + (f", within {ago} s of its last restart" if ago is not None else ""),
                    "meaning": OOMKILLED_MEANING}})
            p.parsed += 1
            continue
        if not row.get("REASON") or not row.get("LAST SEEN"):
            p.quarantine.append((i, "an events row without its reason or age", ln))
            continue
        age = _age_s(row["LAST SEEN"])
        count = row.get("COUNT", "")
        p.events.append(_k8s_fact(taken - age * 1_000_000 if taken is not None and age is not None else None, i, {
            "type": row.get("TYPE") or None, "reason": row["REASON"], "object": row.get("OBJECT") or row.get("NAME"),
            "message": row.get("MESSAGE") or None, "age": row["LAST SEEN"],
            "count": int(count) if is_uint(count) else None, "namespace": row.get("NAMESPACE")}))
        p.parsed += 1
    if any(e["t"] is None for e in p.events):
        p.notes.append(f"{path.name}: a kubectl table gives ages and states, not times; pass --at with when it was "
                       "taken to place them")
    elif p.events:
        p.notes.append(f"{path.name}: event times are --at minus their ages (to the second kubectl rounds to); pod "
                       "states are as of --at")
    return p


def parse_describe(path: Path, text: str, at: str | None = None, tz_offset_s: int = 0) -> Parsed:
    """``kubectl describe pod``: its Events (ages, placed at ``--at`` minus the age when --at says
    when the describe was taken) and each container's terminated State or Last State (OOMKilled/exit
    137, at the time it finished)."""
    p = Parsed(kind="k8s-describe")
    lines = text.splitlines()
    p.lines = len(lines)
    taken = parse_time(at, tz_offset_s) if at else None
    in_events = False
    container: str | None = None
    last: dict[str, Any] | None = None  # the terminated State or Last State block being read
    pod: dict[str, Any] = {}  # the pod's own Name, Reason and Message (its header: an eviction stays there
    # after its event has expired)

    def close_last() -> None:
        nonlocal last
        if last is None:
            return
        kind, meaning = terminated_kind(last.get("reason"), last.get("exit_code"))
        if meaning is not None:
            p.events.append({"t": last.get("t"), "kind": kind, "line": last["line"], "data": {
                "container": container, "reason": last.get("reason"), "exit_code": last.get("exit_code"),
                "meaning": meaning}})
        last = None

    for i, ln in enumerate(lines, start=1):
        p.parsed += 1  # every describe line is read; prose is kept in the input hash, not as a fact
        if ln.startswith("Events:"):
            close_last()
            in_events = True
            continue
        m = DESCRIBE_EV.match(ln) if in_events else None
        if m and m.group(2) != "------":
            age = _age_s(m.group(3).split(" ")[0])
            p.events.append(_k8s_fact(taken - age * 1_000_000 if taken is not None and age is not None else None, i, {
                "type": m.group(1), "reason": m.group(2), "age": m.group(3), "from": m.group(4), "message": m.group(5)}))
            continue
        if in_events:
            continue
        head = re.match(r"^  ([\w.-]+):\s*$", ln)  # a container's block ('  vllm:')
        if head:
            close_last()
            container = head.group(1)
            continue
        kv = re.match(r"^\s*([A-Z][\w ]*?):\s+(.*?)\s*$", ln)  # (unindented: a container's block pasted alone)
        if kv and not ln[:1].isspace() and container is None and last is None and kv.group(1) in ("Name", "Reason", "Message"):
            pod[kv.group(1)] = (kv.group(2), i)
        elif kv and kv.group(1) in ("State", "Last State") and kv.group(2).startswith("Terminated"):
            close_last()
            last = {"line": i}
        elif kv and last is not None and kv.group(1) in ("Reason", "Exit Code", "Finished"):
            key, value = kv.group(1), kv.group(2)
            if key == "Reason":
                last["reason"] = value
            elif key == "Exit Code":
                last["exit_code"] = int(value) if is_uint(value) else None
            elif key == "Finished":
                last["t"] = parse_time(value, tz_offset_s)
        elif kv and last is not None and kv.group(1) in ("Ready", "Restart Count"):
            close_last()
    close_last()
    if pod.get("Reason", ("",))[0] == "Evicted" and not any(e["data"].get("reason") == "Evicted" for e in p.events):
        # (when: not in the header; its event, where it has not expired, says it, and more)
        p.events.append(_k8s_fact(None, pod["Reason"][1], {"reason": "Evicted", "message": pod.get("Message", ("",))[0],
                                                          "object": f"Pod/{pod.get('Name', ('?',))[0]}"}))
    if any("age" in e["data"] and e["t"] is None for e in p.events):
        p.notes.append(f"{path.name}: describe output gives event ages, not times; pass --at with when it was "
                       "taken to place them")
    elif any("age" in e["data"] for e in p.events):
        p.notes.append(f"{path.name}: event times are --at minus their ages (to the second kubectl rounds to)")
    return p


# --- as the registry reads them ---------------------------------------------------------------------
_POD = re.compile(r'(?m)^kind:\s*Pod\s*$|"kind"\s*:\s*"Pod"')


def sniff_objects(head: str) -> str | None:
    """Events and pods as YAML or JSON (a pod's status alone, too)."""
    if head.lstrip().startswith(("{", "[", "---", "apiVersion", "kind:", "status:", "lastState:", "items:", "metadata:")) and (
            "containerStatuses" in head or "lastState" in head or '"Event"' in head or "kind: Event" in head
            or "involvedObject" in head or "regarding" in head or _POD.search(head)):
        return "k8s"
    return None


def sniff_table(head: str) -> str | None:
    s = head.lstrip()
    return "k8s-table" if EVENTS_TABLE_HEADER.match(s) or PODS_TABLE_HEADER.match(s) else None


def sniff_describe(head: str) -> str | None:
    """`kubectl describe`, or a container's terminated state pasted alone."""
    if "Events:" in head and ("Reason" in head and "Message" in head) or head.startswith("Name:") or (
            DESCRIBE_TERMINATED.match(head.lstrip()) and "Exit Code:" in head):
        return "k8s-describe"
    return None


def _objects(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_k8s(path, text)


def _table(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_kubectl_table(path, text, opts.at, opts.tz_offset_s)


def _describe(path: Path, text: str, opts: RecordOptions) -> Parsed:
    return parse_describe(path, text, opts.at, opts.tz_offset_s)


PARSERS: dict[str, Parser] = {"k8s": _objects, "k8s-describe": _describe, "k8s-table": _table}
