"""The ``replay matrix`` and ``replay bisect`` commands (registered in ``replay.cli``:
``app.command("matrix")(matrix_cmd)``, ``app.command("bisect")(bisect_cmd)``)."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from replay.errors import EXIT_CHECK_FAILED, EXIT_USAGE, ReplayError

if TYPE_CHECKING:
    from rich.console import Console

    from replay.drive.runner import RunOptions
    from replay.matrix.local import Backend

_VERSION = re.compile(r"\d+\.\d+(\.\d+)?(\.post\d+)?(,\d+\.\d+(\.\d+)?(\.post\d+)?)*")

# the options every run of a matrix (or bisect step) shares, as `replay run` takes them
Ray = Annotated[str | None, typer.Option("--ray", help="Run on a Ray cluster (pip install 'replay\\[cluster]'): its ADDRESS (host:port, ray://host:10001, auto), or `local` to start one on this host for the command.")]
Retries = Annotated[int, typer.Option(help="Try a run that raised (a fault of the host, a worker or node that died) this many more times; an engine that cannot be installed or started fails at once.")]
CpusPerRun = Annotated[float, typer.Option(help="With --ray on CPU nodes: CPUs a run asks for (times its tensor x pipeline parallel size); on GPU nodes a run asks for that many GPUs.")]
Speed = Annotated[float, typer.Option(help="Time scale: 2 = twice as fast as recorded.")]
Window = Annotated[str | None, typer.Option(help="Replay a slice START:END of trace time (of the bundle's timeline for a bundle), e.g. 10m:20m.")]
BeforeCrash = Annotated[str | None, typer.Option(help="With a bundle: replay the DURATION before its first crash, e.g. 10m.")]
Concurrency = Annotated[int | None, typer.Option(help="Cap outstanding requests (turns the open loop closed; off by default).")]
EngineArgs = Annotated[Path | None, typer.Option(help='JSON file of engine arguments every run gets: an object such as {"max_model_len": 8192}.')]
Model = Annotated[Path | None, typer.Option(help="A real model directory (GPU hosts); default: the tiny local Llama.")]
ModelConfig = Annotated[Path | None, typer.Option(help="Production's model config.json folder (and tokenizer): on a GPU host its architecture with dummy weights; on CPU the tiny model at its vocabulary.")]
Constraints = Annotated[Path | None, typer.Option(help="A pip constraints file (production's `pip freeze`): each version's env is resolved within it.")]
Vocab = Annotated[int, typer.Option(help="Vocabulary of the tiny model (prompt_logprobs cost grows with it).")]
Interval = Annotated[float, typer.Option(help="Sampling interval in seconds.")]
KvCache = Annotated[float, typer.Option(help="KV cache size on the CPU engine (VLLM_CPU_KVCACHE_SPACE).")]
Capacity = Annotated[float | None, typer.Option(help="Emulated capacity: an actual-memory limit that ends a run as an emulated OOM.")]
Seed = Annotated[int, typer.Option(help="Seed for synthesised prompts.")]
Warmup = Annotated[int | None, typer.Option(help="Plain requests each run sends before the trace. Default: with a bundle cut by --window or --before-crash, as many as production had served before it, up to 3; else none. 0: none.")]


def _base(*, speed: float, concurrency: int | None, engine_args: Path | None, set_args: list[str], model: Path | None,
          model_config: Path | None, constraints: Path | None, vocab: int, seed: int, interval: float,
          kv_cache_gib: float, capacity_gib: float | None, warmup: int | None = None) -> RunOptions:
    from replay.drive.runner import RunOptions
    if capacity_gib is not None and not math.isfinite(capacity_gib):
        raise ReplayError(f"--capacity-gib: expected a limit above 0 GiB, got {capacity_gib}", EXIT_USAGE)
    opts = RunOptions(speed=speed, concurrency=concurrency, engine_args_file=engine_args, set_args=set_args,
                      model=model, model_config=model_config, constraints=constraints, vocab=vocab, seed=seed,
                      interval_s=interval, kv_cache_gib=kv_cache_gib,
                      capacity_bytes=None if capacity_gib is None else int(capacity_gib * 2**30), warmup=warmup)
    opts.check()
    return opts


def _cut(window: str | None, before_crash: str | None) -> tuple[tuple[int, int] | None, int | None]:
    """--window START:END and --before-crash DURATION, in µs (as `replay run` reads them)."""
    from replay.units import parse_duration_us
    if window and before_crash:
        raise ReplayError("--window and --before-crash both cut the trace: give one", EXIT_USAGE)
    span: tuple[int, int] | None = None
    if window:
        a, _, b = window.partition(":")
        lo = parse_duration_us(a) if a else 0
        hi = parse_duration_us(b) if b else 2**62
        if lo is None or hi is None or hi <= lo:
            raise ReplayError(f"--window {window!r}: expected START:END such as 600s:1200s or 10m:20m", EXIT_USAGE)
        span = (lo, hi)
    before: int | None = None
    if before_crash:
        before = parse_duration_us(before_crash)
        if before is None or before <= 0:
            raise ReplayError(f"--before-crash {before_crash!r}: expected a duration such as 10m, 90s or 1h", EXIT_USAGE)
    return span, before


@contextlib.contextmanager
def _backend(ray: str | None, retries: int, cpus_per_run: float) -> Iterator[Backend]:
    if retries < 0:
        raise ReplayError(f"--retries: expected 0 or more, got {retries}", EXIT_USAGE)
    if ray is None:
        from replay.matrix.local import LocalBackend
        yield LocalBackend(max_retries=retries)
        return
    try:
        from replay.matrix import ray_backend
    except ImportError as e:
        raise ReplayError(f"--ray: Ray is not installed here ({e}); install the cluster extra: "
                          "pip install 'replay[cluster]'", EXIT_USAGE) from None
    with ray_backend.cluster(ray, max_retries=retries, cpus_per_run=cpus_per_run) as b:
        yield b


def _positional(given: Path, more: list[str] | None, what: str) -> tuple[Path, list[str]]:
    """``--vllm 0.31 0.32``: typer takes 0.32 for a further argument (a version); the input may come
    after them (``--vllm 0.31 0.32 incident.bundle``)."""
    rest = list(more or [])
    if _VERSION.fullmatch(str(given)) and not given.exists() and rest and not _VERSION.fullmatch(rest[-1]):
        given, rest = Path(rest[-1]), [str(given), *rest[:-1]]
    bad = [x for x in rest if not _VERSION.fullmatch(x)]
    if bad:
        raise ReplayError(f"{bad[0]!r}: one {what} is given; the arguments after it are versions (such as 0.31)",
                          EXIT_USAGE)
    return given, rest


def _report_lines(console: Console, root: Path, report: Path | None) -> None:
    from rich.markup import escape
    console.print(f"manifest: {escape(str(root / 'matrix.json'))}")
    if report is not None:
        console.print(f"[green]wrote[/] {escape(str(report))}")


def matrix_cmd(
    bundle_or_trace: Annotated[Path, typer.Argument(help="A production bundle (its requests become the trace, made once: DIR/trace.jsonl) or a replay-trace/1 file.")],
    more_versions: Annotated[list[str] | None, typer.Argument(help="More versions (after --vllm).", show_default=False)] = None,
    vllm: Annotated[list[str] | None, typer.Option(help="vLLM versions: repeat --vllm, list them after one, or separate them by commas.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="An axis of the matrix: key=v1,v2 (an engine argument and its values; repeat for more axes).")] = None,
    ray: Ray = None,
    out: Annotated[Path, typer.Option("-o", "--out", help="The matrix's folder: runs/ (a bundle and log per run), matrix.json, report.html; with --ray a path every node and this host share.")] = Path("matrix"),
    retries: Retries = 1,
    cpus_per_run: CpusPerRun = 1.0,
    speed: Speed = 1.0,
    window: Window = None,
    before_crash: BeforeCrash = None,
    concurrency: Concurrency = None,
    engine_args: EngineArgs = None,
    model: Model = None,
    model_config: ModelConfig = None,
    constraints: Constraints = None,
    vocab: Vocab = 131072,
    interval: Interval = 0.25,
    kv_cache_gib: KvCache = 1.0,
    capacity_gib: Capacity = None,
    seed: Seed = 0,
    warmup: Warmup = None,
) -> None:
    """Replay one incident (or trace) across vLLM versions and engine settings: every version x setting a
    run with a bundle of its own, then one report across them with each run's verdict.

    Resumable: run it again into the same folder and the completed runs are skipped, the failed ones
    retried. A run's OOM (its engine died, the capacity guard fired) is its result, not a failure.
    Locally the runs go one after another; with --ray each is a Ray task on the cluster.

    Exit codes: 0 every run completed (OOMs included), 1 a run failed (matrix.json says why),
    130 interrupted (run it again to go on).
    """
    from replay.cli import err, out_console
    from replay.matrix.orchestrate import print_summary, run_matrix
    from replay.matrix.plan import parse_sets, split_versions
    given, extra = _positional(bundle_or_trace, more_versions, "bundle or trace")
    versions = split_versions([*(vllm or []), *extra])
    sets = parse_sets(set_)
    window_us, before_us = _cut(window, before_crash)
    base = _base(speed=speed, concurrency=concurrency, engine_args=engine_args, set_args=[], model=model,
                 model_config=model_config, constraints=constraints, vocab=vocab, seed=seed, interval=interval,
                 kv_cache_gib=kv_cache_gib, capacity_gib=capacity_gib, warmup=warmup)
    with _backend(ray, retries, cpus_per_run) as backend:
        res = run_matrix(given, out, versions, sets, base, backend=backend, window_us=window_us,
                         before_crash_us=before_us, console=err)
    print_summary(out_console, res.runs)
    _report_lines(err, res.matrix.root, res.report)
    if res.failed:
        raise typer.Exit(EXIT_CHECK_FAILED)


def bisect_cmd(
    bundle: Annotated[Path, typer.Argument(help="The incident's production bundle (or a replay-trace/1 file: each run judged by its own evidence).")],
    good: Annotated[str, typer.Option("--good", help="A release where the incident does not reproduce.")],
    bad: Annotated[str, typer.Option("--bad", help="A release where it does (older or newer than --good).")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="An engine argument every step runs with: key=value.")] = None,
    ray: Ray = None,
    out: Annotated[Path, typer.Option("-o", "--out", help="The bisect's folder: a bundle per step (runs/), matrix.json, bisect.md and bisect.json (the answer), report.html.")] = Path("bisect"),
    retries: Retries = 1,
    cpus_per_run: CpusPerRun = 1.0,
    speed: Speed = 1.0,
    window: Window = None,
    before_crash: BeforeCrash = None,
    concurrency: Concurrency = None,
    engine_args: EngineArgs = None,
    model: Model = None,
    model_config: ModelConfig = None,
    constraints: Constraints = None,
    vocab: Vocab = 131072,
    interval: Interval = 0.25,
    kv_cache_gib: KvCache = 1.0,
    capacity_gib: Capacity = None,
    seed: Seed = 0,
    warmup: Warmup = None,
) -> None:
    """Find, by replaying, the first release between --good and --bad where the incident stops (or starts)
    reproducing: the releases in the catalogue's order that this host (or the cluster) can run, both ends
    replayed, then the middle of what is left. Each step's bundle is kept; the answer and its evidence
    (each step's verdict) go to bisect.md, a report across the steps to report.html.

    Exit codes: 0 the release was found, 1 it was not (the ends do not differ, or the releases between
    could not be judged: bisect.md says which), 130 interrupted (run it again: completed steps are kept).
    """
    from rich.markup import escape

    from replay.cli import err, out_console
    from replay.matrix.bisect import run_bisect
    from replay.matrix.plan import parse_sets
    fixed: dict[str, str] = {}
    for k, vs in parse_sets(set_).items():
        if len(vs) != 1:
            raise ReplayError(f"--set {k}={','.join(vs)}: one value each for a bisect (its steps differ by version only)",
                              EXIT_USAGE)
        fixed[k] = vs[0]
    window_us, before_us = _cut(window, before_crash)
    base = _base(speed=speed, concurrency=concurrency, engine_args=engine_args, set_args=[], model=model,
                 model_config=model_config, constraints=constraints, vocab=vocab, seed=seed, interval=interval,
                 kv_cache_gib=kv_cache_gib, capacity_gib=capacity_gib, warmup=warmup)
    with _backend(ray, retries, cpus_per_run) as backend:
        ans, report = run_bisect(bundle, out, good, bad, base, backend=backend, settings=fixed, window_us=window_us,
                                 before_crash_us=before_us, console=err)
    for i, s in enumerate(ans.steps, 1):
        rep = {True: "reproduced", False: "not reproduced", None: "cannot judge"}[s.reproduced]
        out_console.print(f"step {i}: {escape(s.version)}: {rep} ({escape(s.line)})")
    out_console.print(("[bold]" if ans.found else "[yellow]") + escape(ans.message) + "[/]")
    root = out.resolve()
    err.print(f"answer: {escape(str(root / 'bisect.md'))}")
    _report_lines(err, root, report)
    if not ans.found:
        raise typer.Exit(EXIT_CHECK_FAILED)
