"""A matrix in its folder: the input made into the trace every run replays, the manifest, the runs
executed on a backend (skipping the completed ones), each judged, and the one report across them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from replay.drive.runner import RunOptions
from replay.errors import EXIT_USAGE, ReplayError
from replay.matrix import local
from replay.matrix.local import Attempt, Backend, Job, LocalBackend, RunFn
from replay.matrix.plan import (
    TRACE_NAME,
    Manifest,
    MatrixInput,
    MatrixRun,
    expand,
    fingerprint,
    identify_input,
    now_utc,
    options_for,
    resolve_versions,
    tp_pp,
    write_trace,
)
from replay.matrix.progress import LiveTable
from replay.matrix.results import judge_runs, write_matrix_report

REPORT_NAME = "report.html"

_REASON = {"completed": "completed", "engine_died": "the engine died (exit 10: OOM reproduced)",
           "capacity_guard": "the capacity guard fired (exit 10: emulated OOM reproduced)",
           "interrupted": "interrupted (exit 130)"}


class Matrix:
    """The runs of one input into one folder, on one backend."""

    def __init__(self, given: Path, root: Path, base: RunOptions, *, backend: Backend | None = None,
                 run_fn: RunFn | None = None, window_us: tuple[int, int] | None = None,
                 before_crash_us: int | None = None, console: Console | None = None,
                 extra_options: dict[str, Any] | None = None) -> None:
        if root.exists() and not root.is_dir():
            raise ReplayError(f"-o {root}: is a file; name a folder for the matrix's runs and report", EXIT_USAGE)
        base.check()
        self.root = root.resolve()
        self.backend: Backend = backend or LocalBackend()
        self.run_fn: RunFn = run_fn or local.default_run  # (looked up now: the seam tests replace)
        self.console = console or Console(stderr=True)
        self.input: MatrixInput = identify_input(given)
        if self.input.kind == "trace" and before_crash_us is not None:
            raise ReplayError("--before-crash: only for a bundle (a trace has no crash on it); use --window", EXIT_USAGE)
        bundle_window = window_us if self.input.kind == "bundle" else None
        self.base = replace(base, window=window_us if self.input.kind == "trace" else None)
        options = fingerprint(self.base, {"bundle_window_us": list(bundle_window) if bundle_window else None,
                                          "before_crash_us": before_crash_us, **(extra_options or {})})
        shared = self.backend.shared
        where = TRACE_NAME if self.input.kind == "bundle" or shared else str(self.input.path.resolve())
        self.manifest = Manifest.open(self.root, self.input.to_json(), where, options)  # (refuses another's folder)
        self.manifest.backend = self.backend.name
        write_trace(self.input, self.root, window_us=bundle_window, before_crash_us=before_crash_us, shared=shared)
        self.manifest.save()

    @property
    def production(self) -> Path | None:
        return self.input.production

    def plan(self, versions: list[str], sets: dict[str, list[str]]) -> list[MatrixRun]:
        """The runs of versions x settings, as the manifest holds them (versions resolved where they can be)."""
        runs = self.manifest.add(expand(resolve_versions(versions, self.backend.device), sets))
        self.manifest.save()
        return runs

    def ensure(self, runs: list[MatrixRun], title: str = "matrix") -> list[MatrixRun]:
        """Execute the runs that have not completed (a failed or interrupted one again); the others are
        skipped. The manifest is written as each run ends; a run's OOM is a result."""
        todo = [r for r in runs if not self.manifest.done(r)]
        todo_ids = {r.id for r in todo}
        jobs = [Job(r.id, self.input.trace, options_for(self.base, r, self.root),
                    (self.root / r.bundle).with_suffix(".log"), tp_pp(r.settings, self.base)) for r in todo]
        for r in todo:
            r.status, r.reason = "pending", None
        self.manifest.save()
        table = LiveTable(self.console, f"{title}: {len(runs)} runs, {len(runs) - len(todo)} completed before "
                                        f"({self.backend.name})")
        for r in runs:
            table.add(r.id, r.version, r.settings, "queued" if r.id in todo_ids else "skipped",
                      "" if r.id in todo_ids else (r.outcome or "completed"))

        def progress(run_id: str, info: dict[str, Any]) -> None:
            run = self.manifest.runs.get(run_id)
            if run is not None and info.get("state") == "running":
                run.status = "running"
                run.node = info.get("node") or run.node
            table.update(run_id, info)

        with table:
            try:
                self.backend.execute(jobs, self.run_fn, progress, self._record)
            except BaseException:
                for r in todo:
                    if r.status in ("pending", "running"):
                        r.status, r.reason = "interrupted", "the matrix was stopped before the run ended"
                self.manifest.save()
                raise
        return runs

    def _record(self, job: Job, a: Attempt, earlier: list[str], attempts: int) -> None:
        r = self.manifest.runs[job.run_id]
        r.attempts += attempts
        r.errors = [*earlier, *([a.error] if a.status == "failed" and a.error else [])]
        r.status = a.status  # type: ignore[assignment]
        r.exit_code, r.outcome = a.exit_code, a.outcome
        r.node = a.node or r.node
        r.wall_s = a.wall_s or None
        r.finished_utc = now_utc()
        r.reproduced = r.verdict = None
        if a.status == "failed":
            r.reason = a.error or "failed"
        else:
            r.reason = _REASON.get(str(a.outcome), f"{a.outcome} (exit {a.exit_code})")
        if a.status == "completed":
            try:
                from replay.bundle import read_bundle
                r.vllm_version = read_bundle(self.root / r.bundle).meta.vllm_version
            except ReplayError as e:  # (written on a node whose disk the driver does not share)
                r.status = "failed"
                r.reason = (f"its bundle {self.root / r.bundle} cannot be read here ({e.message}): the matrix folder "
                            "(-o) must be a path every node and the driver share")
        self.manifest.save()

    def assess(self, runs: list[MatrixRun]) -> list[MatrixRun]:
        """Judge the completed runs (against production, where the input is its bundle); return them."""
        done = [r for r in runs if self.manifest.done(r)]
        if done:
            for r, j in zip(done, judge_runs(self.production, [self.root / r.bundle for r in done])):
                r.reproduced, r.verdict = j.reproduced, j.line
            self.manifest.save()
        return done

    def report(self, runs: list[MatrixRun], name: str = REPORT_NAME) -> Path | None:
        """One report across the completed runs (and production): ``ROOT/report.html``."""
        done = [r for r in runs if self.manifest.done(r)]
        if not done:
            return None
        out = self.root / name
        write_matrix_report(self.production, [self.root / r.bundle for r in done], out)
        self.manifest.report = name
        self.manifest.save()
        return out


@dataclass
class MatrixResult:
    matrix: Matrix
    runs: list[MatrixRun]
    report: Path | None

    @property
    def failed(self) -> list[MatrixRun]:
        return [r for r in self.runs if r.status != "completed"]


def run_matrix(given: Path, root: Path, versions: list[str], sets: dict[str, list[str]], base: RunOptions, *,
               backend: Backend | None = None, run_fn: RunFn | None = None, window_us: tuple[int, int] | None = None,
               before_crash_us: int | None = None, console: Console | None = None, report: bool = True) -> MatrixResult:
    """``replay matrix``: every version x setting replayed into ``root`` (completed runs of an earlier
    call skipped), each judged, and one report across them (``root/report.html``)."""
    m = Matrix(given, root, base, backend=backend, run_fn=run_fn, window_us=window_us,
               before_crash_us=before_crash_us, console=console)
    runs = m.ensure(m.plan(versions, sets))
    m.assess(runs)
    path = m.report(runs) if report else None
    return MatrixResult(m, runs, path)


def summary_lines(runs: list[MatrixRun]) -> list[str]:
    """A line per run: its id, status and reason, and its verdict."""
    out = []
    for r in runs:
        verdict = ("" if r.status != "completed" else
                   f": {'reproduced' if r.reproduced else 'not reproduced' if r.reproduced is False else 'cannot judge'}"
                   + (f" ({r.verdict})" if r.verdict else ""))
        tries = f" after {r.attempts} attempts" if r.attempts > 1 else ""
        out.append(f"{r.id}: {r.status}{tries}, {r.reason or ''}{verdict}")
    return out


def print_summary(console: Console, runs: list[MatrixRun]) -> None:
    for line in summary_lines(runs):
        console.print(escape(line))
