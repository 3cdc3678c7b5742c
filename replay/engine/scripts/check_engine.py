"""Load a vLLM version's own pieces on a model, without a device, and validate engine arguments.

Run with an engine environment's own python:
``python check_engine.py MODEL_DIR --dist vllm --out RESULTS.jsonl --argv '["--max-model-len", "2048"]'``.
Each stage writes one JSON line to ``--out`` ({"stage", "ok", "s", "detail"}; ``ok`` null for a
stage that needs a device this host lacks) and the script stops at the first failure (exit 1).
Stages: import, config (vLLM's config loader), tokenizer (vLLM's get_tokenizer), parser (the API
server's argument parser), model_class (the model registry's class for the architecture), args
(the engine arguments through that parser into AsyncEngineArgs), engine_config (the engine's
config built from them; on a CUDA build without a GPU a failure there is reported, not counted).

With ``--options FILE`` instead of a model it writes the API server parser's option strings (a
JSON list) to FILE (vLLM logs to stdout), the argument list ``replay`` validates engine arguments against; a CUDA build on a host
without a GPU gets the same device-less platform first, as its ``--help`` stops at device inference.

Only the standard library at module level: the pieces are looked up where each vLLM release
keeps them.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import io
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")


class Failed(Exception):
    pass


def first(candidates: list[tuple[str, str]]) -> Any:
    """The first ``module:attribute`` of a list that imports; Failed naming them all if none."""
    errors = []
    for mod, attr in candidates:
        try:
            obj = getattr(importlib.import_module(mod), attr)
            return obj
        except (ImportError, AttributeError) as e:
            errors.append(f"{mod}.{attr}: {e}")
    raise Failed("not found: " + "; ".join(errors))


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return (text if isinstance(e, Failed) else f"{type(e).__name__}: {text}")[:400]


class Checker:
    def __init__(self, out: str) -> None:
        self.out = open(out, "a", buffering=1)  # noqa: SIM115 - kept open for the run
        self.failed = False

    def stage(self, name: str, fn: Callable[[], str], device_bound: bool = False) -> bool:
        t0 = time.monotonic()
        ok: bool | None
        try:
            detail = fn()
            ok = True
        except SystemExit as e:  # argparse's error()
            detail, ok = f"exit {e.code}", False
        except BaseException as e:  # noqa: BLE001 - every failure is a result here
            detail, ok = one_line(e), (None if device_bound else False)
            if os.environ.get("REPLAY_DEBUG"):
                traceback.print_exc()
        self.out.write(json.dumps({"stage": name, "ok": ok, "s": round(time.monotonic() - t0, 3),
                                   "detail": detail}) + "\n")
        if ok is False:
            self.failed = True
        return ok is not False


def install_deviceless_cuda() -> str | None:
    """A CUDA build on a host without a GPU detects no platform (vLLM 0.6.4 on resolves it lazily),
    and its argument parser then stops at device inference (``Failed to infer device type``).
    Before anything resolves it, put in a platform that describes CUDA without touching a device,
    so the version's own parser and argument checks run as they do on a GPU host. None where the
    platform is resolved differently (0.6.3 and older: at import) or a device platform is found."""
    try:
        plat = importlib.import_module("vllm.platforms")
        iface = importlib.import_module("vllm.platforms.interface")
    except ImportError:
        return None
    resolve = getattr(plat, "resolve_current_platform_cls_qualname", None)
    if resolve is None or getattr(plat, "_current_platform", "absent") is not None:
        return None
    if not str(resolve()).endswith("UnspecifiedPlatform"):
        return None
    capability = getattr(iface, "DeviceCapability", None)

    class DevicelessCuda(iface.Platform):  # type: ignore[misc, name-defined]
        _enum = iface.PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"
        dispatch_key = "CUDA"
        ray_device_key = "GPU"
        dist_backend = "nccl"
        device_control_env_var = "CUDA_VISIBLE_DEVICES"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            return capability(major=8, minor=0) if capability else None

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "no device (replay versions check)"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 80 * 2**30

        @classmethod
        def is_async_output_supported(cls, enforce_eager: bool | None) -> bool:
            return True

    setattr(plat, "_current_platform", DevicelessCuda())  # noqa: B010 - a module of the env
    STAND_IN.append(DevicelessCuda)
    return "device-less CUDA stand-in (compute capability 8.0)"


STAND_IN: list[Any] = []


@contextlib.contextmanager
def no_device() -> Any:
    """While model code is imported, the stand-in says it is no CUDA platform: modules probe their
    kernels at import where the platform is CUDA (``cutlass_fp8_supported``), and without a driver
    the kernels are not loaded; on a host without a device vLLM imports them this way."""
    if not STAND_IN:
        yield
        return
    cls = STAND_IN[0]
    cuda = cls._enum
    cls._enum = type(cuda).UNSPECIFIED
    try:
        yield
    finally:
        cls._enum = cuda


def api_parser() -> Any:
    """The version's own API server argument parser, as its ``vllm serve`` builds it."""
    parser_cls = first([("vllm.utils.argparse_utils", "FlexibleArgumentParser"),
                        ("vllm.utils", "FlexibleArgumentParser")])
    make = first([("vllm.entrypoints.openai.cli_args", "make_arg_parser"),
                  ("vllm.entrypoints.launchers.cli_args", "make_arg_parser")])
    return make(parser_cls(description="vLLM OpenAI-compatible API server"))


def list_options(dist: str, out: str) -> int:
    """Write the parser's long option strings as a JSON list; exit 1 with the failure on stderr."""
    try:
        import torch
        import vllm  # noqa: F401
        if dist == "vllm" and not torch.cuda.is_available():
            install_deviceless_cuda()
        with contextlib.redirect_stdout(io.StringIO()):
            parser = api_parser()
    except BaseException as e:  # noqa: BLE001 - reported in one line
        print(one_line(e), file=sys.stderr)
        return 1
    with open(out, "w") as fh:
        json.dump(sorted(o for o in parser._option_string_actions if o.startswith("--")), fh)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--dist", default="vllm")
    ap.add_argument("--out")
    ap.add_argument("--argv", default="[]", help="the engine arguments, a JSON list of strings")
    ap.add_argument("--options", metavar="FILE", help="write the API server's option strings to FILE")
    a = ap.parse_args()
    if a.options:
        return list_options(a.dist, a.options)
    if a.model is None or a.out is None:
        ap.error("MODEL and --out are needed (or --options)")
    argv = [str(x) for x in json.loads(a.argv)]
    ck = Checker(a.out)
    st: dict[str, Any] = {}

    def do_import() -> str:
        import importlib.metadata as md

        import torch
        import vllm  # noqa: F401
        st["torch"] = torch
        st["gpu"] = bool(torch.cuda.is_available())
        said = (f"{a.dist} {md.version(a.dist)}, torch {torch.__version__}, transformers "
                f"{md.version('transformers')}, GPU {'yes' if st['gpu'] else 'no'}")
        if a.dist == "vllm" and not st["gpu"]:
            stand_in = install_deviceless_cuda()
            if stand_in:
                said += f"; platform: {stand_in}"
        return said

    def do_config() -> str:
        get_config = first([("vllm.transformers_utils.config", "get_config")])
        cfg = get_config(a.model, False)
        st["archs"] = list(getattr(cfg, "architectures", None) or [])
        if not st["archs"]:
            raise Failed(f"{a.model}/config.json names no architecture")
        return f"{cfg.__class__.__name__}, {', '.join(st['archs'])}, vocab {cfg.vocab_size}"

    def do_tokenizer() -> str:
        get_tokenizer = first([("vllm.transformers_utils.tokenizer", "get_tokenizer"),
                               ("vllm.tokenizers", "get_tokenizer")])
        tok = get_tokenizer(a.model)
        text = "The quick brown fox jumps over the lazy dog."
        ids = tok.encode(text)
        back = tok.decode(ids, skip_special_tokens=True)
        if not ids or back.strip() != text:
            raise Failed(f"round trip gave {back!r} for {text!r}")
        return f"{type(tok).__name__}, {len(tok)} tokens, {len(ids)} ids for the probe sentence"

    def do_parser() -> str:
        parser = api_parser()
        st["parser"] = parser
        with contextlib.redirect_stdout(io.StringIO()) as buf, contextlib.suppress(SystemExit):
            parser.parse_args(["--help"])
        helptext = buf.getvalue()
        n = len(parser._option_string_actions)
        if "--model" not in parser._option_string_actions or "--max-model-len" not in helptext:
            raise Failed(f"the parser knows no --model/--max-model-len ({n} options)")
        return f"{n} option strings, --help {len(helptext.splitlines())} lines"

    def do_model_class() -> str:
        with no_device():
            registry = first([("vllm.model_executor.models", "ModelRegistry"),
                              ("vllm.model_executor.models.registry", "ModelRegistry")])
            for arch in st["archs"]:
                for meth in ("_try_load_model_cls", "load_model_cls"):
                    fn = getattr(registry, meth, None)
                    cls = fn(arch) if fn is not None else None
                    if cls is not None:
                        return f"{arch} -> {cls.__module__}.{cls.__qualname__}"
            info = getattr(registry, "models", {})
            lazy = info.get(st["archs"][0]) if isinstance(info, dict) else None
            if lazy is not None and hasattr(lazy, "load_model_cls"):
                cls = lazy.load_model_cls()  # raises what the registry logged and swallowed
                return f"{st['archs'][0]} -> {cls.__module__}.{cls.__qualname__}"
            raise Failed(f"the model registry has no class for {st['archs']}")

    def do_args() -> str:
        parser = st["parser"]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(["--model", a.model, *argv])
        except SystemExit as e:
            msg = err.getvalue().strip().splitlines()
            line = msg[-1] if msg else f"exit {e.code}"
            line = line.split(": error: ", 1)[-1]
            if "unrecognized arguments" in line:
                opts = [o for o in parser._option_string_actions if o.startswith("--")]
                for bad in line.split(":", 1)[1].split():
                    if bad.startswith("--"):
                        near = difflib.get_close_matches(bad.split("=")[0], opts, n=1, cutoff=0.5)
                        if near:
                            line += f" (nearest: {near[0]})"
                            break
            raise Failed(line) from None
        engine_args_cls = first([("vllm.engine.arg_utils", "AsyncEngineArgs")])
        st["engine_args"] = engine_args_cls.from_cli_args(ns)
        given = [x for x in argv if x.startswith("--")]
        return f"{len(given)} given ({' '.join(given) or 'none'}), AsyncEngineArgs built"

    def do_engine_config() -> str:
        cfg = st["engine_args"].create_engine_config()
        mc = getattr(cfg, "model_config", None)
        return f"{type(cfg).__name__}, max_model_len {getattr(mc, 'max_model_len', '?')}"

    for name, fn in (("import", do_import), ("config", do_config), ("tokenizer", do_tokenizer),
                     ("parser", do_parser), ("model_class", do_model_class), ("args", do_args)):
        if not ck.stage(name, fn):
            return 1
    # Without a GPU a CUDA build's engine config may stop at device detection: reported, not counted.
    cuda_build = a.dist == "vllm"
    ck.stage("engine_config", do_engine_config, device_bound=cuda_build and not st.get("gpu"))
    return 1 if ck.failed else 0


if __name__ == "__main__":
    sys.exit(main())
