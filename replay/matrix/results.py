"""What each run of a matrix showed, and the one report across them.

Against a production bundle a run's verdict is ``replay.analysis.verdict``'s: reproduced or not (None:
cannot judge), at which request, against production's crash or onset on trace time. A matrix of a
plain trace has no production: each run is judged by its own evidence (an OOM, the engine's death,
its memory diverging from vLLM's accounting), and the report sets the runs beside each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from replay.analysis.cache import analysis_of
from replay.analysis.pipeline import Analysis


@dataclass
class Judged:
    reproduced: bool | None
    line: str
    evidence: list[str]
    version: str | None


def own_verdict(a: Analysis) -> Judged:
    """A run judged by its own evidence (no production to compare with)."""
    b = a.bundle
    version = b.meta.vllm_version
    crash = a.first_crash
    oom = a.oom_us
    if oom is not None and (crash is None or oom <= crash["t_us"]):
        kinds = sorted({str(e.get("kind")) for e in b.events if e.get("t_us") == oom})
        line = f"OOM at {oom / 1e6:.1f} s of the run ({', '.join(kinds)})"
        return Judged(True, line, [line], version)
    if crash is not None:
        line = f"{crash.get('kind')} at {crash['t_us'] / 1e6:.1f} s of the run, of a cause its evidence does not state"
        return Judged(True, line, [line], version)
    if a.div.onset_us is not None:
        line = (f"memory diverged from vLLM's accounting at {a.div.onset_us / 1e6:.1f} s of the run "
                f"(gap up to {(a.div.max_gap_bytes or 0) / 2**30:.2f} GiB)")
        return Judged(True, line, [line], version)
    if b.meta.extra.get("outcome") == "interrupted":
        return Judged(None, "interrupted before it ended", ["the run was interrupted"], version)
    if a.memory_judged:
        line = f"no OOM, no engine death and no divergence over {a.end_us / 1e6:.1f} s"
        return Judged(False, line, [line], version)
    line = "no OOM and no engine death; its memory was not measured against vLLM's accounting"
    return Judged(None, line, [line], version)


def judge_runs(production: Path | None, bundles: list[Path]) -> list[Judged]:
    """Each bundle's verdict: against production where there is one, else by its own evidence."""
    analyses = [analysis_of(p) for p in bundles]
    if production is None or not analyses:
        return [own_verdict(a) for a in analyses]
    from replay.analysis.verdict import verdict_lines, verdicts_of
    vs = verdicts_of(analysis_of(production), analyses)
    return [Judged(v.reproduced, line, list(v.evidence), v.version)
            for v, line in zip(vs, verdict_lines(vs))]


def write_matrix_report(production: Path | None, bundles: list[Path], out: Path) -> int:
    """One report across the runs: beside production where there is one, else the first run beside the
    others."""
    from replay.report.html import write_report
    if production is not None:
        return write_report(production, bundles, out)
    return write_report(bundles[0], bundles[1:], out)
