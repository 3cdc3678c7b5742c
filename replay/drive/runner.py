"""``replay run``: a trace through a real vLLM server of a chosen version, measured, into a bundle.

The run survives what it reproduces: when the engine dies (OOM, killed, capacity guard) or the
user presses Ctrl-C, it records the event with the last samples and the server log tail, marks
in-flight requests aborted, stops the driver, writes a complete bundle and exits with a distinct
code. The server's process group is always terminated.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from replay.bundle import BundleMeta, BundleWriter, bundle_written
from replay.drive.driver import Driver, request_body
from replay.drive.images import (
    TokenGrid,
    images_per_request,
    limit_mm_per_prompt,
    request_image_tokens,
)
from replay.drive.probe import ProbeReader, probe_env
from replay.engine import args as eargs
from replay.engine import envs
from replay.engine.ballast import Ballast, scaled_utilization
from replay.engine.model import (
    DEFAULT_VOCAB,
    VisionTower,
    ensure_tiny_model,
    takes_images,
    tiny_model_dir,
)
from replay.engine.server import EngineServer
from replay.engine.translate import translate
from replay.errors import (
    EXIT_INTERRUPTED,
    EXIT_OOM_REPRODUCED,
    EXIT_TERMINATED,
    ReplayError,
    refuse_options,
)
from replay.nvml import NvmlReader, open_nvml
from replay.record.recorder import write_log_facts
from replay.sampler import Sampler
from replay.text import console as text_console
from replay.trace.format import TraceHeader, read_trace
from replay.trace.prompts import PROMPT_VOCAB, synth_prompt_ids
from replay.units import fraction

CPU_FIXED_ARGS = ("dtype", "enforce_eager")  # (of CPU_DEFAULT_ARGS: the CPU engine runs these whatever production ran)
TINY_MAX_MODEL_LEN = 8192  # (the tiny model's max_position_embeddings)
CPU_DEFAULT_ARGS: dict[str, Any] = {"dtype": "bfloat16", "enforce_eager": True, "max_model_len": 8192,
                                    "max_logprobs": 20}


@dataclass
class RunOptions:
    vllm: str = "0.32"
    out: Path = Path("bundles/replay")
    speed: float = 1.0
    window: tuple[int, int] | None = None  # µs
    concurrency: int | None = None
    engine_args_file: Path | None = None
    set_args: list[str] = field(default_factory=list)
    model: Path | None = None
    vocab: int = DEFAULT_VOCAB
    seed: int = 0
    interval_s: float = 0.25
    kv_cache_gib: float = 1.0
    model_config: Path | None = None  # production's config.json (and tokenizer): its architecture, dummy weights
    constraints: Path | None = None  # a pip constraints file the engine env is resolved within (production's pins)
    capacity_bytes: int | None = None
    install: bool = True
    output_policy: str = "observed"
    torch_history: bool = False  # record allocation history in the engine for the OOM snapshot (costs time)
    emulate_capacity: bool = False  # on a bigger GPU: hold the difference in a ballast, scale the budget
    warmup: int | None = None  # requests sent before the trace (None: as many as production had served, up to 3)
    tower: VisionTower | None = None  # the tiny Qwen2-VL's vision tower (None: the default one)

    def check(self) -> None:
        """Refuse, by the option's name, a value that cannot make a replay: a time scale of zero
        divides by it, a concurrency cap of zero was taken as none (and one below zero failed), a
        sampling interval of zero spins, a capacity of zero was silently none."""
        def positive(x: float) -> bool:
            return math.isfinite(x) and x > 0
        refuse_options([
            ("--speed", positive(self.speed), "a time scale above 0 (2 = twice as fast as recorded)", self.speed),
            ("--concurrency", self.concurrency is None or self.concurrency >= 1, "at least 1 outstanding request",
             self.concurrency),
            ("--interval", math.isfinite(self.interval_s) and self.interval_s >= MIN_INTERVAL_S,
             f"at least {MIN_INTERVAL_S} s between samples", self.interval_s),
            ("--kv-cache-gib", positive(self.kv_cache_gib), "a KV cache size above 0 GiB", self.kv_cache_gib),
            ("--capacity-gib", self.capacity_bytes is None or self.capacity_bytes > 0, "a limit above 0 GiB",
             None if self.capacity_bytes is None else self.capacity_bytes / 2**30),
            ("--warmup", self.warmup is None or self.warmup >= 0, "0 or more requests", self.warmup),
            *(self.tower.problems() if self.tower is not None else []),
            ("--vocab", self.model is not None or self.vocab >= PROMPT_VOCAB,
             f"at least {PROMPT_VOCAB} (synthesised prompts use token ids below {PROMPT_VOCAB})", self.vocab),
        ])


MIN_INTERVAL_S = 0.01  # (NVML and /metrics answer in milliseconds; faster sampling measures the sampler)
WARMUP_MAX = 3  # (the warm-up a windowed incident gets by default: its server's first allocations behind it)
WARMUP_MAX_TOKENS = 16


@dataclass(frozen=True)
class Warmup:
    """Requests sent one after another once the server is ready and before the trace's clock starts, so the
    server's one-off first-request allocations are behind the replay, as they were behind production's
    incident when its server had served before the trace's window. Not in the bundle's requests; an event
    states them."""

    requests: int
    input_tokens: int
    max_tokens: int
    why: str

    def bodies(self, seed: int) -> list[tuple[int, str, dict[str, Any]]]:
        return [(0, f"warmup-{i}", {"prompt": synth_prompt_ids(self.input_tokens, seed, f"warmup-{i}"),
                                    "max_tokens": self.max_tokens, "temperature": 0.0})
                for i in range(self.requests)]


def _requests(n: int, what: str = "") -> str:
    return f"{n:,} {what}request" + ("" if n == 1 else "s")


def plan_warmup(header: TraceHeader, reqs: list[dict[str, Any]], asked: int | None,
                max_model_len: int | None) -> Warmup | None:
    """The warm-up: ``asked`` requests (0: none); by default as many as production had served before the
    trace's window, up to WARMUP_MAX, none for a trace that starts where its server did or does not say. Each
    of production's median prompt before the window (else the trace's), plain: no logprobs, no images."""
    served = (header.production or {}).get("served_before") or {}
    n = asked if asked is not None else min(WARMUP_MAX, int(served.get("requests") or 0))
    if n <= 0:
        return None
    lens = sorted(int(r["input_tokens"]) for r in reqs if r.get("input_tokens"))
    tokens = served.get("input_tokens") or (lens[len(lens) // 2] if lens else 256)
    cap = max(1, int(max_model_len or 8192) - WARMUP_MAX_TOKENS - 1)
    out = min(WARMUP_MAX_TOKENS, int(served.get("max_tokens") or WARMUP_MAX_TOKENS))
    why = (f"--warmup {n}" if asked is not None else
           f"production's server had served {_requests(int(served['requests']))} before the trace's window")
    return Warmup(n, max(1, min(int(tokens), cap)), max(1, out), why)


@dataclass
class RunResult:
    bundle: Path
    exit_code: int
    outcome: str  # completed | engine_died | capacity_guard | interrupted
    sent: int
    ok: int
    failed: int
    aborted: int
    peak_rss_bytes: int | None
    baseline_rss_bytes: int | None
    sampler_cpu_s: float
    engine_cpu_s: float
    replay_cpu_s: float
    lateness_p99_us: float | None


def trace_link(header: TraceHeader) -> dict[str, Any] | None:
    """Which production bundle the trace came from and where its t=0 lies on production's timeline (a
    report of production beside this replay aligns them by it and by the request ids)."""
    prod = header.production or {}
    if header.source.get("format") != "replay-bundle":
        return None
    return {"bundle": prod.get("bundle"), "bundle_sha256": prod.get("bundle_sha256"),
            "production_t0_utc": prod.get("t0_utc"), "window_us": prod.get("window_us"),
            "offset_us": (header.time or {}).get("bundle_offset_us")}


def _p99(xs: list[int]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return float(s[min(len(s) - 1, int(0.99 * len(s)))])


def user_engine_args(opts: RunOptions) -> dict[str, Any]:
    """The engine arguments the user gave: the --engine-args JSON file (an object of name: value),
    then the --set overrides."""
    out: dict[str, Any] = {}
    if opts.engine_args_file:
        try:
            given = json.loads(opts.engine_args_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ReplayError(f"{opts.engine_args_file}: cannot read engine args JSON ({e})", 2) from None
        if not isinstance(given, dict):
            raise ReplayError(f"{opts.engine_args_file}: engine args must be a JSON object of argument names and values "
                              f'(such as {{"max_model_len": 8192}}), not {type(given).__name__}', 2)
        out.update(given)
    out.update(eargs.parse_set(opts.set_args))
    return out


def _plan_emulation(nvml: NvmlReader | None, prod: dict[str, Any], engine_args: dict[str, Any], opts: RunOptions,
                    console: Console) -> dict[str, Any] | None:
    """On a GPU other than production's: warn, or (--emulate-capacity, local GPU bigger) plan a ballast
    of the difference and scale gpu_memory_utilization so vLLM's budget in bytes is production's."""
    gpus = nvml.read() if nvml is not None else []
    prod_total = prod.get("gpu_total_bytes")
    if not gpus or not prod_total:
        return None
    local = gpus[0].total_bytes
    if local is None:  # (a unified-memory device states none: no capacity to compare or to emulate)
        console.print("[yellow]warning:[/] this GPU states no memory of its own (unified memory): production's "
                      "capacity cannot be compared or emulated")
        return None
    if abs(local - int(prod_total)) < 2**30:
        return None
    where = f"this GPU has {local / 2**30:.1f} GiB, production's {prod.get('gpu_name') or ''} had {int(prod_total) / 2**30:.1f} GiB"
    if not opts.emulate_capacity or local < int(prod_total):
        console.print(f"[yellow]warning:[/] {escape(where)}; memory headroom differs from the incident"
                      + ("" if local < int(prod_total) else " (--emulate-capacity holds the difference)"))
        return None
    given = engine_args.get("gpu_memory_utilization")
    util = 0.9 if given is None else fraction(given)  # (vLLM's default)
    if util is None:
        raise ReplayError(f"gpu_memory_utilization {given!r} is not a fraction of GPU memory in (0, 1] (such as 0.9)", 2)
    scaled = scaled_utilization(util, int(prod_total), local)
    engine_args["gpu_memory_utilization"] = scaled
    console.print(f"emulating production capacity: {escape(where)}; ballast {(local - int(prod_total)) / 2**30:.1f} GiB, "
                  f"gpu_memory_utilization {util} -> {scaled}")
    return {"production_total_bytes": int(prod_total), "local_total_bytes": local,
            "ballast_bytes": local - int(prod_total), "gpu_memory_utilization_production": util,
            "gpu_memory_utilization_scaled": scaled}


@dataclass
class RunPlan:
    """What a replay will run, decided before anything starts (``replay run --dry-run`` prints it)."""

    spec: envs.EnvSpec
    header: TraceHeader
    requests: list[dict[str, Any]]
    engine_args: dict[str, Any]  # what the server is given, after translation to the target version
    model: str  # the model directory, or what it will be
    model_kind: str  # tiny | weights | config (production's architecture, dummy weights)
    vocab: int | None
    notes: list[str]
    warmup: Warmup | None = None

    def to_json(self) -> dict[str, Any]:
        return {"vllm": {"version": self.spec.version, "dist": self.spec.dist, "device": self.spec.device,
                         "env": str(self.spec.path), "installed": envs.is_installed(self.spec)},
                "engine_args": self.engine_args,
                "model": {"path": self.model, "kind": self.model_kind, "vocab": self.vocab,
                          "production": (self.header.production or {}).get("model")},
                "requests": len(self.requests),
                "window_us": list(self.window_us) if self.window_us else None,
                "warmup": asdict(self.warmup) if self.warmup else None,
                "notes": self.notes}

    @property
    def window_us(self) -> tuple[int, int] | None:
        w = (self.header.production or {}).get("window_us")
        return (int(w[0]), int(w[1])) if isinstance(w, list) and len(w) == 2 else None


def _model_config(path: Path) -> dict[str, Any]:
    """The production model's config.json (``--model-config DIR``), read to say what it is and its vocabulary."""
    cfg = path / "config.json" if path.is_dir() else path
    try:
        obj = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ReplayError(f"--model-config {path}: cannot read {cfg.name} ({e})", 2) from None
    if not isinstance(obj, dict):
        raise ReplayError(f"--model-config {path}: {cfg.name} is not a model configuration (a JSON object)", 2)
    return obj


def _choose_model(spec: envs.EnvSpec, opts: RunOptions, prod_model: str | None,
                  notes: list[str]) -> tuple[str, str, int | None, dict[str, Any]]:
    """The model the replay serves: real weights (--model), production's architecture with dummy weights
    (--model-config on a GPU host), or the tiny local Llama (at production's vocabulary, where the config
    gives it). Returns path, kind, vocabulary and engine arguments it needs."""
    if opts.tower is not None and (opts.model is not None or opts.model_config is not None):
        raise ReplayError("--vision-patch/--vision-merge/--vision-max-pixels: they shape the tiny model; with --model or "
                          "--model-config the model's own processor decides", 2)
    if opts.model is not None:
        return str(opts.model), "weights", None, {}
    if opts.model_config is not None:
        cfg = _model_config(opts.model_config)
        vocab = cfg.get("vocab_size") if isinstance(cfg.get("vocab_size"), int) else None
        if spec.device == "cuda":
            notes.append(f"production's architecture from {opts.model_config} ({cfg.get('architectures', ['?'])[0]}) "
                         "with random weights (--load-format dummy): weights, activations and KV cache take "
                         "production's memory, without its weights")
            return str(opts.model_config), "config", vocab, {"load_format": "dummy"}
        if vocab is not None:
            opts.vocab = max(vocab, PROMPT_VOCAB)
            notes.append(f"the CPU engine runs the tiny model at production's vocabulary ({vocab:,} tokens, from "
                         f"{opts.model_config}/config.json): logits memory grows with it")
    what = f"production's {prod_model}" if prod_model else "production's model"
    tiny = "Qwen2-VL" if spec.variant == envs.VISION else "Llama"  # (a vision env serves the tiny Qwen2-VL)
    notes.append(f"the replay runs the tiny local {tiny} (vocabulary {opts.vocab:,}), not {what}: its memory is "
                 "the tiny model's, its traffic production's" if spec.device == "cpu" else
                 f"the replay runs the tiny local {tiny}, not {what} (--model DIR or --model-config DIR for it)")
    if opts.tower is not None and spec.variant != envs.VISION:
        raise ReplayError(f"--vision-patch/--vision-merge/--vision-max-pixels: they shape the tiny Qwen2-VL of a vision "
                          f"env (--vllm {'.'.join(spec.version.split('.')[:2])}+{envs.VISION}); vLLM {spec.version} "
                          f"({spec.variant or spec.device}) serves the text Llama", 2)
    if opts.tower is not None:
        notes.append(f"the tiny Qwen2-VL's vision tower: {opts.tower.patch}-pixel patches, {opts.tower.merge} x "
                     f"{opts.tower.merge} merged into a token, images up to {opts.tower.max_pixels:,} pixels")
    return str(tiny_model_dir(opts.vocab, opts.seed, spec, opts.tower)), "tiny", opts.vocab, {}


def _no_vision_note(reqs: list[dict[str, Any]], spec: envs.EnvSpec, kind: str) -> str:
    """What a trace's image requests meet on a model without a vision tower, and the env that takes them."""
    n = sum(1 for r in reqs if images_per_request(r.get("mm")))
    fix = (f"replay on --vllm {'.'.join(spec.version.split('.')[:2])}+{envs.VISION} (the CPU engine with torchvision "
           "and a tiny Qwen2-VL) to send them" if spec.device == "cpu" and kind == "tiny" else
           "serve a vision-language model (--model DIR) to send them")
    return (f"{n:,} of the trace's requests carry images, and the served model takes none: the server will refuse "
            f"each (reported with its error); {fix}")


def plan(trace_path: Path, opts: RunOptions, console: Console | None = None) -> RunPlan:
    """Read the trace and decide the run: the version env, the engine arguments (production's, translated
    to the target version, then the user's), the model, the requests. Starts nothing and installs nothing."""
    opts.check()
    header, reqs = read_trace(trace_path)
    if opts.window:
        a, b = opts.window
        reqs = [r for r in reqs if a <= r["t_us"] < b]
        for r in reqs:
            r["t_us"] -= a
    if not reqs:
        raise ReplayError(f"{trace_path}: no requests to replay (check --window)", 2)
    user_args = user_engine_args(opts)  # (checked before an engine is installed for them)
    spec = envs.resolve(opts.vllm, constraints=opts.constraints)
    envs.adopt_existing(spec)
    notes: list[str] = list(header.notes or [])
    prod = header.production or {}
    known = eargs.known_args(spec) if envs.is_installed(spec) else None
    tr = translate(dict(header.engine_args or {}), production=prod.get("vllm_version"), target=spec.version,
                   device="cpu" if spec.device == "cpu" else "cuda", target_known=known)
    notes += tr.notes()
    model, kind, vocab, model_args = _choose_model(spec, opts, prod.get("model"), notes)
    engine_args: dict[str, Any] = dict(CPU_DEFAULT_ARGS) if spec.device == "cpu" else {}
    if takes_images(model, spec) and limit_mm_per_prompt(reqs):  # (production's own limit, in tr.args, wins)
        engine_args["limit_mm_per_prompt"] = limit_mm_per_prompt(reqs)
    elif limit_mm_per_prompt(reqs):
        notes.append(_no_vision_note(reqs, spec, kind))
    engine_args.update(tr.args)
    if spec.device == "cpu":  # (what the CPU engine needs: production's GPU settings do not apply to it)
        for k in CPU_FIXED_ARGS:
            if k in tr.args and tr.args[k] != CPU_DEFAULT_ARGS[k]:
                notes.append(f"production's {k}={tr.args[k]!r} does not apply to the CPU engine; the replay runs "
                             f"{CPU_DEFAULT_ARGS[k]!r}")
            engine_args[k] = CPU_DEFAULT_ARGS[k]
    if kind == "tiny" and int(engine_args.get("max_model_len") or 0) > TINY_MAX_MODEL_LEN:
        notes.append(f"production's max_model_len {engine_args['max_model_len']} is beyond the tiny model's "
                     f"{TINY_MAX_MODEL_LEN}: the replay runs {TINY_MAX_MODEL_LEN}")
        engine_args["max_model_len"] = TINY_MAX_MODEL_LEN
    engine_args.update(model_args)
    engine_args.update(user_args)
    if known is not None:
        eargs.to_argv(engine_args, known, spec.version)  # (refuses an unknown argument now, by name)
    warmup = plan_warmup(header, reqs, opts.warmup, engine_args.get("max_model_len"))
    if warmup is not None:
        notes.append(f"warm-up: {_requests(warmup.requests, 'plain ')} of {warmup.input_tokens} prompt tokens before the trace "
                     f"({warmup.why}; --warmup 0 for none): the server's first allocations are behind the replay")
    return RunPlan(spec, header, reqs, engine_args, model, kind, vocab, notes, warmup)


def run(trace_path: Path, opts: RunOptions, console: Console | None = None) -> RunResult:
    """Replay ``trace_path`` into the bundle ``opts.out``, written beside it and swapped in once it is
    complete: a replay ended by Ctrl-C or by the engine's death is complete (that is what it
    measured); one that fails (the engine does not start, a full disk) or is stopped while its bundle
    is written leaves ``opts.out`` as it was. The log of an engine that failed to start is kept beside
    it (OUT.server.log), where the error names it."""
    with bundle_written(opts.out) as into:
        try:
            res = _run(trace_path, replace(opts, out=into), console)
        except ReplayError as e:
            _keep_server_log(e, into / "server.log", opts.out)
            raise
    return replace(res, bundle=opts.out)


def _warm_up(url: str, model: str, w: Warmup, seed: int, writer: BundleWriter, t_wall0: float,
             console: Console) -> None:
    """Send the warm-up, one request after another, before the sampler and the trace's clock start; an
    event states it and how it went (a warm-up that failed is said, and the replay goes on)."""
    driver = Driver(url, model, concurrency=1)
    t_us = int((time.time() - t_wall0) * 1e6)
    with console.status(f"warming the server up: {w.requests} requests of {w.input_tokens} prompt tokens"):
        outcomes = asyncio.run(driver.run(w.bodies(seed)))
    ok = sum(1 for o in outcomes.values() if o.status == "ok")
    errors = sorted({o.error for o in outcomes.values() if o.error})
    writer.event({"t_us": t_us, "kind": "warmup", "source": "replay", "requests": w.requests, "ok": ok,
                  "input_tokens": w.input_tokens, "max_tokens": w.max_tokens,
                  "end_us": int((time.time() - t_wall0) * 1e6),
                  "note": f"before the trace, not in its requests: {w.why}" + (f"; failed: {errors[0]}" if errors else "")})
    if ok < w.requests:
        console.print(f"[yellow]warm-up: {w.requests - ok} of {w.requests} requests failed[/]"
                      + (f" ({escape(errors[0])})" if errors else ""))


def _keep_server_log(e: ReplayError, log: Path, out: Path) -> None:
    """The engine's log, which the error names, moved out of the bundle that is not written (never
    over a file that is there)."""
    if str(log) not in e.message or not log.is_file():
        return
    for kept in (out.with_name(out.name + ".server.log"), out.with_name(f"{out.name}.server.{os.getpid()}.log")):
        if not os.path.lexists(kept):
            os.replace(log, kept)
            e.message = e.message.replace(str(log), str(kept))
            e.args = (e.message,)
            return


def _run(trace_path: Path, opts: RunOptions, console: Console | None = None) -> RunResult:
    console = console or text_console(stderr=True)
    p = plan(trace_path, opts, console)
    header, reqs, spec, engine_args = p.header, p.requests, p.spec, p.engine_args
    for n in p.notes:
        console.print(f"[dim]note: {escape(n)}[/]")
    if not envs.is_installed(spec):
        if not opts.install:
            raise ReplayError(f"vLLM {spec.version} is not installed; run `replay versions install {spec.version}`", 4)
        with console.status(f"installing {spec.dist}=={spec.version} into {escape(str(spec.path))} (once)"):
            spec = envs.install(spec, log=lambda m: console.print(f"[dim]{escape(m)}[/]"), constraints=opts.constraints)
    nvml = open_nvml() if spec.device == "cuda" else None
    emulation = _plan_emulation(nvml, header.production or {}, engine_args, opts, console)
    with console.status(f"reading vLLM {spec.version}'s argument list"):
        allowed = eargs.known_args(spec)
    argv = eargs.to_argv(engine_args, allowed, spec.version)
    if p.model_kind == "tiny":
        with console.status("building the tiny local model (once)"):
            model_dir: Path | str = ensure_tiny_model(spec, opts.vocab, opts.seed, opts.tower)
    else:
        model_dir = p.model
    out = opts.out
    out.mkdir(parents=True, exist_ok=True)
    server_env = {"VLLM_CPU_KVCACHE_SPACE": str(int(opts.kv_cache_gib)) if float(opts.kv_cache_gib).is_integer() else str(opts.kv_cache_gib)} if spec.device == "cpu" else {}
    server_env.update(probe_env(out / "probe", opts.interval_s, opts.torch_history))
    server = EngineServer(spec, model_dir, argv, out / "server.log", env=server_env)
    prod = header.production or {}
    meta = BundleMeta(kind="replay", vllm_version=spec.version, engine=None, engine_args=engine_args,
                      model=str(model_dir),
                      gpus=[], inputs=[{"path": str(trace_path), "kind": "trace", "requests": len(reqs)}],
                      extra={"device": spec.device, "notes": p.notes, "trace": trace_link(header),
                             "production_engine_args": header.engine_args, "model_kind": p.model_kind,
                             "speed": opts.speed, "seed": opts.seed, "window_us": opts.window,
                             "concurrency": opts.concurrency, "production": prod,
                             "capacity_bytes": opts.capacity_bytes, "kv_cache_gib": opts.kv_cache_gib,
                             "output_policy": opts.output_policy, "interval_s": opts.interval_s,
                             "emulation": emulation})
    writer = BundleWriter(out, meta)
    block = (header.prefix or {}).get("block_size")
    items = []
    for r in reqs:
        ids = None if r.get("prompt") or r.get("prompt_token_ids") else synth_prompt_ids(
            int(r.get("input_tokens") or 1), opts.seed, str(r["id"]), prefix_blocks=r.get("prefix_blocks"),
            block_size=block)
        if r.get("prompt_token_ids"):
            ids = r["prompt_token_ids"]
        items.append((int(r["t_us"]), str(r["id"]), request_body(r, ids, output_policy=opts.output_policy)))
    items.sort(key=lambda x: x[0])

    outcome = "completed"
    died = threading.Event()
    guard_hit: list[int] = []
    driver = Driver(server.url, str(model_dir), speed=opts.speed, concurrency=opts.concurrency)
    loop_ref: list[asyncio.AbstractEventLoop] = []

    drive_done = threading.Event()  # set once the driver's loop has finished: nothing left to stop

    def stop_driver() -> None:
        if loop_ref and not drive_done.is_set():
            try:
                loop_ref[0].call_soon_threadsafe(driver.stop)
            except RuntimeError:  # the loop closed in between: the driver has already stopped
                pass

    def on_capacity(v: int) -> None:
        if not guard_hit:
            guard_hit.append(v)
            died.set()
            stop_driver()

    interrupted = False
    stopped_by: list[int] = []  # the signal that stopped the replay: Ctrl-C's, or SIGTERM's (a stop asked of it)
    prev_handler = signal.getsignal(signal.SIGINT)
    prev_term = signal.getsignal(signal.SIGTERM)

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal interrupted
        interrupted = True
        stopped_by.append(signum)
        stop_driver()

    t_wall0 = time.time()
    cpu0 = time.process_time()
    meta.t0_utc = datetime.fromtimestamp(t_wall0, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    sampler: Sampler | None = None
    ballast: Ballast | None = None
    baseline = None
    try:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, on_sigint)
            signal.signal(signal.SIGTERM, on_sigint)  # (a stop asked of the replay ends it as Ctrl-C does: a complete bundle)
        if emulation is not None:  # before the engine starts: vLLM measures free memory at startup
            with console.status(f"holding a {emulation['ballast_bytes'] / 2**30:.1f} GiB ballast on GPU 0"):
                free = nvml.read()[0].free_bytes if nvml is not None else None
                ballast = Ballast(spec.python, int(emulation["ballast_bytes"]), "cuda:0", free_before_bytes=free)
                ballast.start()
                emulation["ballast_pid"] = ballast.pid
                emulation["ballast_context_bytes"] = ballast.context_bytes
        with console.status(f"starting vLLM {spec.version} ({spec.device}) server"):
            server.start()
        ready_us = int((server.ready_at or time.time()) * 1e6 - t_wall0 * 1e6)
        baseline = server.rss_bytes()
        uuids = {g.uuid: g.index for g in nvml.read() if g.uuid} if nvml is not None else {}
        probe = ProbeReader(out / "probe", t_wall0, uuids)
        sampler = Sampler(writer, t_wall0, metrics_url=f"{server.url}/metrics",
                          rss=server.rss_bytes if spec.device == "cpu" else None, nvml=nvml, pids=server.pids,
                          interval_s=opts.interval_s, capacity_bytes=opts.capacity_bytes, on_capacity=on_capacity,
                          probe=probe, ballast_pids={ballast.pid} if ballast is not None and ballast.pid else None)
        writer.event({"t_us": ready_us, "kind": "engine_ready", "source": "replay", "rss_bytes": baseline,
                      "device": spec.device, "note": "engine memory at ready: weights + KV pool + runtime, "
                      "everything vLLM sized at startup"})
        if p.warmup is not None and not interrupted:
            _warm_up(server.url, str(model_dir), p.warmup, opts.seed, writer, t_wall0, console)
        sampler.start()

        def watchdog() -> None:
            while not died.is_set() and not driver._stop.is_set() and not drive_done.is_set():
                if not server.alive():
                    died.set()
                    stop_driver()
                    return
                time.sleep(0.2)

        wd = threading.Thread(target=watchdog, daemon=True)
        wd.start()
        t_drive0_perf = time.perf_counter()
        offset_us = int((time.time() - t_wall0) * 1e6)
        with Progress(TextColumn("[bold]replay[/]"), BarColumn(), TextColumn("{task.completed}/{task.total} sent"),
                      TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console,
                      transient=False) as prog:
            task = prog.add_task("replay", total=len(items), detail="")

            def tick() -> None:
                s = driver.stats
                rss = sampler.last_rss if sampler else None
                prog.update(task, completed=s.sent, detail=f"ok {s.finished} failed {s.failed} "
                            f"mem {rss / 2**30 if rss else 0:.2f} GiB")

            async def go() -> None:
                loop_ref.append(asyncio.get_running_loop())
                if interrupted or died.is_set():  # (stopped before the driver's loop ran: nothing to send)
                    driver.stop()
                await driver.run(items, t0=t_drive0_perf, on_tick=tick)

            try:
                asyncio.run(go())
            finally:
                drive_done.set()
            tick()
        if interrupted:
            outcome = "interrupted"
        elif guard_hit:
            outcome = "capacity_guard"
        elif died.is_set() or not server.alive():
            outcome = "engine_died"
    finally:
        if sampler:
            if outcome != "completed" or died.is_set():
                sampler.sample_once(None)  # the last samples before the end
            sampler.stop()
        engine_cpu = server.cpu_seconds()
        stop_us = int((time.time() - t_wall0) * 1e6)
        server.stop()
        if ballast is not None:
            ballast.stop()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, prev_handler)
            signal.signal(signal.SIGTERM, prev_term)

    # Requests
    grid = TokenGrid.of_model(model_dir)  # (the served model's image processor: each request's image tokens)
    for sched, rid, body in items:
        oc = driver.outcomes.get(rid)
        r = next(x for x in reqs if str(x["id"]) == rid)
        s = r.get("sampling") or {}
        writer.request({
            "id": rid, "arrival_us": offset_us + int(sched / opts.speed),
            "sent_us": offset_us + oc.sent_us if oc and oc.sent_us is not None else None,
            "first_token_us": offset_us + oc.first_token_us if oc and oc.first_token_us is not None else None,
            "finish_us": offset_us + oc.finish_us if oc and oc.finish_us is not None else None,
            "input_tokens": oc.input_tokens if oc and oc.input_tokens is not None else
            len(body["prompt"]) if isinstance(body["prompt"], list) else r.get("input_tokens"),  # (the server's count first)
            "output_tokens": oc.output_tokens if oc else None, "max_tokens": body.get("max_tokens"),
            "prompt_logprobs": s.get("prompt_logprobs"), "logprobs": s.get("logprobs"), "n": s.get("n"),
            "best_of": s.get("best_of"), "mm_items": sum(int(m.get("count") or 1) for m in r.get("mm") or []),
            "image_tokens": request_image_tokens(r.get("mm"), grid),
            "prefix_blocks": len(r.get("prefix_blocks") or []),
            "status": oc.status if oc else "aborted", "error": oc.error if oc else "not sent", "source": "replay"})
    # Server log -> samples and events (the recorder's), times on the run's clock.
    def kind_of(kind: str, t_rel: int | None) -> str:
        if kind == "engine_death" and outcome != "engine_died" and t_rel is not None and t_rel >= stop_us - 1_000_000:
            return "engine_shutdown"  # (logged while the replay was shutting the server down: an orderly stop)
        return kind

    parsed = write_log_facts(writer, out / "server.log", datetime.now(timezone.utc).year, int(t_wall0 * 1e6), kind_of)
    meta.vllm_version_inferred = parsed.version
    meta.engine = parsed.engine  # (the engine the server's own log shows it ran: V0 or V1; None if it says neither)
    end_us = int((time.time() - t_wall0) * 1e6)
    if outcome in ("engine_died", "capacity_guard"):
        writer.event({"t_us": end_us, "kind": "emulated_oom" if outcome == "capacity_guard" else "engine_death",
                      "source": "replay", "label": "EMULATED OOM (capacity guard on CPU), not a real device OOM"
                      if outcome == "capacity_guard" else "engine process exited during the replay",
                      "rss_bytes": guard_hit[0] if guard_hit else None, "capacity_bytes": opts.capacity_bytes,
                      "log_tail": server.log_tail(30)})
    if outcome == "interrupted":
        term = signal.SIGTERM in stopped_by
        writer.event({"t_us": end_us, "kind": "interrupted", "source": "replay", "label": "SIGTERM" if term else "Ctrl-C"})
    statuses = [o.status for o in driver.outcomes.values()]
    if driver.stats.waited_for_connection:
        console.print(f"[yellow]note:[/] {driver.stats.waited_for_connection} requests were sent late: this process may "
                      f"hold {driver.stats.connection_cap} connections at once (its open-file limit); their lateness "
                      "is in the bundle")
    for failure in sampler.failures() if sampler else []:
        meta.notes.append(failure)
        console.print(f"[yellow]warning:[/] {escape(failure)}")
    replay_cpu = time.process_time() - cpu0
    meta.extra.update({
        "outcome": outcome, "baseline_rss_bytes": baseline,
        "peak_rss_bytes": sampler.peak_rss if sampler else None,
        "overhead": {"sampler_cpu_s": round(sampler.cpu_s, 3) if sampler else None,
                     "replay_process_cpu_s": round(replay_cpu, 3), "engine_cpu_s": round(engine_cpu, 3),
                     "samples": sampler.n if sampler else 0},
        "driver": {"sent": driver.stats.sent, "lateness_p99_us": _p99(driver.stats.lateness_us),
                   "connection_cap": driver.stats.connection_cap,
                   "waited_for_connection": driver.stats.waited_for_connection},
        "probe": {**sampler.probe.summary(), "note": "torch allocator probe (in-engine, read-only); allocator "
                  "samples only where the engine initialised CUDA"} if sampler and sampler.probe else None,
    })
    writer.close()
    code = {"completed": 0, "engine_died": EXIT_OOM_REPRODUCED, "capacity_guard": EXIT_OOM_REPRODUCED,
            "interrupted": EXIT_TERMINATED if signal.SIGTERM in stopped_by else EXIT_INTERRUPTED}[outcome]
    return RunResult(out, code, outcome, driver.stats.sent, statuses.count("ok"), statuses.count("error"),
                     statuses.count("aborted"), sampler.peak_rss if sampler else None, baseline,
                     sampler.cpu_s if sampler else 0.0, engine_cpu, replay_cpu, _p99(driver.stats.lateness_us))
