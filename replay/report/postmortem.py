"""``replay postmortem``: a Markdown draft in the Google SRE shape, prefilled only with what the
bundle shows, with explicit TODO prompts for what only people know.

Every text from the evidence (file, host and bundle names, request ids, versions, notes, and the
findings' words that quote them) goes in through ``_md`` (``escape.md_text``) or in a code span
(``escape.md_code``): a backtick, a bracket or a ``<`` in it cannot end our code span, link an image
or put raw HTML into the draft."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import polars as pl

from replay.analysis.cache import analysis_of
from replay.analysis.outages import starts
from replay.analysis.pipeline import crash_summary, kill_cause
from replay.analysis.verdict import verdict_lines, verdicts_of
from replay.atomic import written_in_place
from replay.report.escape import md_code, md_item, md_link, md_text
from replay.units import say_duration

_md = md_text


# how the summary names the first crash the evidence holds (``outages.DOWN_KINDS``)
_CRASH_WORDS = {"oom": "A CUDA OOM followed", "engine_death": "The engine died",
                "host_oom_killed": "The container was killed for host memory (not a CUDA OOM)",
                "emulated_oom": "Actual memory crossed the production capacity (an emulated OOM)",
                "container_killed": "The container was killed with SIGKILL (exit 137; Kubernetes did not say OOMKilled)"}


def _crash_words(e: dict[str, Any], events: list[dict[str, Any]]) -> str:
    if e.get("kind") == "oom" and e.get("warmup"):
        return f"A CUDA OOM stopped the engine's start-up, warming up its {_md(e['warmup'])} (it never served)"
    if e.get("kind") == "host_oom_killed" and e.get("killer") == "ray":
        return "Ray's memory monitor killed a worker for the node's host memory (not a CUDA OOM)"
    cause = kill_cause(e, events)
    if cause and cause[0] == "evicted":
        return f"The kubelet evicted the pod, the node low on {_md(cause[1])} (not an OOM),"
    if cause:
        return f"The kubelet killed the container, its {_md(cause[1])} probe failed (not an OOM),"
    return _CRASH_WORDS.get(str(e.get("kind")), "The engine failed")


def render_postmortem(bundle: Path, report_link: str | None = None, compare: list[Path] | None = None) -> str:
    """The draft for ``bundle``; with ``compare`` (replays of its trace), the verdict of each beside it."""
    a = analysis_of(bundle)
    b = a.bundle
    s = a.summary()
    verdicts = verdicts_of(a, [analysis_of(p) for p in compare]) if compare else []
    t0 = datetime.fromisoformat(b.meta.t0_utc.replace("Z", "+00:00")) if b.meta.t0_utc else None

    def utc(us: int | None) -> str:
        if us is None:
            return "time unknown"
        return (t0 + timedelta(microseconds=us)).strftime("%Y-%m-%d %H:%M:%S UTC") if t0 else f"t0+{us / 1e6:.1f}s"

    status = pl.col("status")  # (counted by a query: a day of log holds millions of requests)
    n_requests, failed, aborted, unfinished = b.scan_requests().select(
        pl.len(), (status == "error").sum().alias("failed"), (status == "aborted").sum().alias("aborted"),
        (status == "unknown").sum().alias("unfinished")).collect().row(0)
    L: list[str] = [f"# Postmortem draft: vLLM out-of-memory ({_md(bundle.name)})", ""]
    L += ["Status: DRAFT — TODO: owner, reviewers, date", ""]
    if report_link:
        L += [f"HTML report: {md_link(report_link, report_link)}", ""]
    L += ["## Summary", ""]
    first_down = a.first_crash
    crash = crash_summary(first_down, b.events)
    accounted = f"{s['accounted_gib']} GiB" if s["accounted_gib"] is not None else "an unknown amount (no startup accounting in the evidence)"
    actual = (f"{s['peak_actual_gib']} GiB ({_md(s['actual_source'])})" if s["peak_actual_gib"] is not None
              else f"unknown (the evidence holds device memory of several {_md(s['machine_kind'])}, {s['machine_series']} "
                   f"series, and none was chosen: record with {_md(s['machine_choice'])})" if s["machine_series"]
              else "unknown (no memory measurement in the evidence)")
    L.append(f"vLLM {_md(b.meta.vllm_version or b.meta.vllm_version_inferred or '(version not in evidence)')} "
             f"({_md(b.meta.engine or 'engine unknown')}). vLLM accounted for {accounted}; peak actual memory was {actual}. "
             + (f"Actual memory started to diverge at {utc(a.div.onset_us)}." if a.div.onset_us is not None else "No divergence was detected.")
             + (f" {_crash_words(first_down, b.events)} at {utc(first_down['t_us'])}." if first_down is not None else "")
             + (" The evidence states no cause for it (no OOM line, GPU error or kill near it): a crash, not a known OOM."
                if crash is not None and not crash["cause_stated"] else ""))
    if verdicts:
        L += ["", "Replays of its trace: " + "; ".join(_md(v) for v in verdict_lines(verdicts)) + "."]
    L += ["", "TODO: one paragraph in plain words for readers outside the team.", "", "## Impact", ""]
    L.append(f"- Requests in the evidence: {n_requests}; failed: {failed}; aborted: {aborted}"
             + (f"; with no end in the evidence (in flight when it ends, or lost in a crash): {unfinished}" if unfinished else "")
             + ".")
    L.append(f"- Engine starts seen in logs: {s['engine_starts']}.")
    if a.outages:
        total = sum(o.seconds(a.end_us) for o in a.outages)
        open_ended = any(o.lower_bound for o in a.outages)
        L.append("- Downtime from crash to the next engine start: " + (
            f"{len(a.outages)} outage(s), of a length the evidence does not show (it ends with the crash):"
            if open_ended and total <= 0 else f"{'at least ' if open_ended else ''}{say_duration(total)} in {len(a.outages)} outage(s):"))
        for o in a.outages:
            back = (f"back at {utc(o.up_us)}: {say_duration(o.seconds(a.end_us))}" if o.up_us is not None
                    else "not back within the evidence, which ends with it" if o.seconds(a.end_us) <= 0
                    else f"not back within the evidence: at least {say_duration(o.seconds(a.end_us))}")
            L.append(f"  - {utc(o.down_us)}: {_md(o.cause)} ({_md(o.source)}), {back}")
    L += ["- TODO: user-facing impact (error rate, latency, customers affected).", "", "## Root causes", ""]
    if a.findings:
        L.append("Ranked hypotheses (from the evidence; confirm or reject each):")
        L.append("")
        for i, f in enumerate(a.findings, 1):
            L.append(f"{i}. **{_md(f.title)}** ({_md(f.confidence)}): {_md(f.detail)}")
    elif a.unjudged:
        L.append("No finding could be made: this evidence cannot show one (below: what it cannot judge).")
    else:
        L.append("No finding in the evidence. TODO: what else should have been collected?")
    if a.unjudged:
        L += ["", "What this evidence cannot judge, and what evidence would settle it:", ""]
        L += [f"- **{_md(u.what)}**: {_md(u.why)}. Would settle it: {_md(u.settle)}." for u in a.unjudged]
    L += ["", "## Trigger", ""]
    if a.attributions:
        at = a.attributions[0]
        L.append(f"Traffic near the onset was dominated by **{_md(at.feature)}** ({_md(at.why)}); "
                 f"requests: {_md(', '.join(at.near_ids[:10]))}.")
    else:
        L.append("TODO: what traffic or change triggered it (not identifiable from the evidence).")
    L += _at_crash(b.events, utc, any(e.get("kind") == "oom" for e in b.events))
    if verdicts:
        L += ["", "## Reproduction", "", f"Replays of the incident's trace beside production ({_md(bundle.name)}), on trace time:", ""]
        for line in verdict_lines(verdicts, evidence=True):
            L.append(f"- {md_item(line)}" if not line.startswith("  - ") else f"  - {md_item(line[4:])}")
    L += ["", "## Resolution", "", "TODO: what was done to restore service.", "", "## Detection", ""]
    if a.div.onset_us is not None and a.oom_us is not None:
        L.append(f"First detectable signal (divergence onset) at {utc(a.div.onset_us)}, {(a.oom_us - a.div.onset_us) / 1e6:.1f} s before the OOM.")
    elif a.div.onset_us is not None and crash is not None and crash["t_us"] is not None:
        L.append(f"First detectable signal (divergence onset) at {utc(a.div.onset_us)}, "
                 f"{(crash['t_us'] - a.div.onset_us) / 1e6:.1f} s before the crash ({_md(crash['what'])}).")
    elif a.div.onset_us is not None:
        L.append(f"First detectable signal (divergence onset) at {utc(a.div.onset_us)}.")
    L += ["Note: `vllm:kv_cache_usage_perc` is the fill of vLLM's KV pool, not device memory; alert on device memory "
          "(DCGM_FI_DEV_FB_USED or NVML) against vLLM's budget instead.", "", "TODO: how it was actually noticed.", "",
          "## Action items", "", "| action | type | owner | from finding |", "|---|---|---|---|"]
    actions: dict[tuple[str, str], list[str]] = {}  # (action, type) -> the findings that ask for it, once each
    for f in a.findings:
        if f.id == "headroom":
            action = (_md(f.detail), "mitigate")
        elif f.id.startswith("cause:prompt_logprobs"):
            action = ("Cap or reject prompt_logprobs on long prompts (--max-logprobs, gateway limit)", "prevent")
        elif f.id.startswith("oom:fragmentation"):
            action = ("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "mitigate")
        elif f.id == "startup:gpu_in_use":
            action = ("Check that the GPU is free before the engine starts (an orphaned EngineCore, a second engine) "
                      "and alert on it", "prevent")
        elif f.id == "divergence":
            action = ("Add a CI gate: `replay check --max-discrepancy 3` on a replay of this trace", "detect")
        else:
            continue
        ids = actions.setdefault(action, [])
        if f.id not in ids:
            ids.append(f.id)
    L += [f"| {what} | {kind} | TODO | {_md(', '.join(ids))} |" for (what, kind), ids in actions.items()]
    advice = next((e for e in b.events if e.get("kind") == "startup_free" and e.get("kv_cache_memory_fit_bytes")), None)
    if advice is not None:  # vLLM's own figure, from its start-up summary
        fit = int(advice["kv_cache_memory_fit_bytes"])
        L.append(f"| Size the KV pool in bytes, `--kv-cache-memory={fit}` ({fit / 2**30:.2f} GiB: vLLM's own figure to fit "
                 "the requested memory, from its start-up summary), instead of `--gpu-memory-utilization` | mitigate | "
                 f"TODO | {_md(advice.get('source'))} |")
    L += ["| TODO | | | |", "", "## Lessons learned", "", "- What went well: TODO", "- What went wrong: TODO",
          "- Where we got lucky: TODO", "", "## Timeline (UTC, merged from every source)", ""]
    named: dict[int, str] = {}  # an engine's start named a start, or a restart after a crash or a stop
    for st in starts(b.events):
        named[id(st.markers[0])] = f"engine {st.label}" + (f" (after {st.after})" if st.after else "")
        for m in st.markers[1:]:
            named[id(m)] = "engine start marker (the same start)"
    rows = [{**e, "kind": named.get(id(e), e["kind"])} for e in b.events
            if e.get("t_us") is not None and not str(e.get("kind")).startswith("request_")]
    if a.div.onset_us is not None:
        rows.append({"t_us": a.div.onset_us, "kind": "divergence onset (analysis)", "source": s["actual_source"]})
    for row in sorted(rows, key=lambda e: e["t_us"])[:200]:
        L.append(f"- {utc(row['t_us'])} — {_md(row['kind'])} ({_md(row.get('source'))})")
    L += ["", "## Supporting information", ""]
    for inp in b.meta.inputs:  # (with what the recorder noted of each: folded, repeated or corrected data)
        L.append(f"- {md_code(inp.get('path'))} ({_md(inp.get('kind'))}) sha256 {md_code(str(inp.get('sha256') or '')[:16] + '…')}, "
                 f"quarantined {_md(inp.get('quarantined', 0))}")
        L += [f"  - {md_item(n)}" for n in inp.get("notes") or []]
    for n in b.meta.notes:
        L.append(f"- note: {_md(n)}")
    return "\n".join(L) + "\n"


def write_postmortem(bundle: Path, out: Path, report_link: str | None, compare: list[Path] | None = None) -> None:
    text = render_postmortem(bundle, report_link, compare)
    with written_in_place(out) as part:  # (the last draft stays whole until this one is)
        part.write_text(text, encoding="utf-8", errors="backslashreplace")  # (a non-UTF-8 file name: escaped)


def _at_crash(events: list[dict[str, Any]], utc: Callable[[int | None], str], oom: bool) -> list[str]:
    """What vLLM itself said of its scheduler and the batch it was running when its engine failed (V1's
    dump): the traffic at the moment of the crash, in vLLM's own numbers."""
    out: list[str] = []
    for e in [e for e in events if e.get("kind") in ("batch_at_crash", "scheduler_at_crash")][:6]:
        if e["kind"] == "batch_at_crash":
            longest = (f"; the longest new prompt {e['longest_new_prompt_tokens']:,} tokens"
                       if e.get("longest_new_prompt_tokens") is not None else "")
            ids = e.get("request_ids") or []
            named = f"; requests {_md(', '.join(ids[:10]))}{' …' if len(ids) > 10 else ''}" if ids else ""
            out.append(f"- At {utc(e.get('t_us'))} the batch vLLM was executing held {_n(e.get('scheduled_tokens'))} tokens "
                       f"of {_n(e.get('requests'))} requests ({_n(e.get('new_requests'))} new{longest}{named}) "
                       f"({_md(e.get('source'))}).")
        else:
            kv = e.get("kv_usage_pct")
            out.append(f"- At {utc(e.get('t_us'))} its scheduler had {_n(e.get('running'))} requests running and "
                       f"{_n(e.get('waiting'))} waiting, its KV cache {f'{kv:.1f}' if isinstance(kv, (int, float)) else _n(kv)}% full "
                       f"({_md(e.get('source'))}).")
    if out:
        out = ["", "When the engine failed, vLLM said (its own dump):", ""] + out
        if oom:  # (the dump follows any engine failure; this reading holds for a device OOM)
            out += ["", "The KV pool is allocated whole at start-up, so a fuller pool asks for no more memory: what "
                    "ran out was memory outside it (this batch's activations, CUDA graphs, fragmentation, or another "
                    "process)."]
    return out


def _n(v: Any) -> str:
    return "?" if v is None else f"{v:,}" if isinstance(v, (int, float)) else _md(v)
