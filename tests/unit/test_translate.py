"""Production's engine arguments translated to another vLLM, by the shipped catalogue's real data."""

from __future__ import annotations

import json
from typing import Any

import pytest

from replay.engine.catalogue import load
from replay.engine.translate import Change, translate


def _by_name(changes: list[Change]) -> dict[str, Change]:
    return {c.name: c for c in changes}


def test_removed_argument_is_dropped_naming_its_last_release() -> None:
    t = translate({"max_seq_len_to_capture": 8192, "max_num_seqs": 64}, production="0.10.2", target="0.32.0")
    assert t.args == {"max_num_seqs": 64}
    c = _by_name(t.changes)
    assert c["max_seq_len_to_capture"] == Change(
        "max_seq_len_to_capture", "dropped", None, 8192,
        "--max-seq-len-to-capture does not exist in 0.32.0 (removed after 0.10.2); dropped")
    assert c["max_num_seqs"].kind == "kept" and c["max_num_seqs"].new_name == "max_num_seqs"
    assert t.notes() == ["--max-seq-len-to-capture does not exist in 0.32.0 (removed after 0.10.2); dropped"]
    # removed in 0.18.0: the same argument still passes to 0.17.1
    assert translate({"swap_space": 8}, production="0.10.2", target="0.17.1").args == {"swap_space": 8}
    t = translate({"swap_space": 8}, production="0.10.2", target="0.18.0")
    assert t.notes() == ["--swap-space does not exist in 0.18.0 (removed after 0.17.1); dropped"]


def test_renames_stated_by_the_sources() -> None:
    t = translate({"disable_log_requests": True, "cuda_graph_sizes": [1, 2, 4], "override_pooler_config": {"a": 1},
                   "max_context_len_to_capture": 4096},
                  production="0.10.1", target="0.17.0")
    assert t.args == {"enable_log_requests": False, "cudagraph_capture_sizes": [1, 2, 4],
                      "pooler_config": {"a": 1}}
    assert t.notes() == [
        "--disable-log-requests does not exist in 0.17.0: --disable-log-requests=True became "
        "--enable-log-requests=False (stated in 0.10.1)",
        "--cuda-graph-sizes does not exist in 0.17.0: renamed to --cudagraph-capture-sizes (stated in 0.11.1)",
        "--override-pooler-config does not exist in 0.17.0: renamed to --pooler-config (stated in 0.11.0)",
        "--max-context-len-to-capture does not exist in 0.17.0 (removed after 0.6.3.post1); vLLM 0.6.0 named "
        "--max-seq-len-to-capture for it, which 0.17.0 lacks too; dropped",
    ]
    ren = _by_name(t.changes)["cuda_graph_sizes"]
    assert (ren.kind, ren.new_name, ren.value) == ("renamed", "cudagraph_capture_sizes", [1, 2, 4])
    # one release later than the statement, still in the target: kept as it is
    assert translate({"cuda_graph_sizes": [8]}, production="0.11.1", target="0.12.0").args == {"cuda_graph_sizes": [8]}
    # deprecated but still there (removed in 0.17.0): kept as production had it
    t = translate({"disable_log_requests": True}, production="0.10.1", target="0.16.0")
    assert t.args == {"disable_log_requests": True} and t.notes() == []
    # the rename that the target has: 0.6.0 -> 0.8.5
    t = translate({"max_context_len_to_capture": 4096}, production="0.6.0", target="0.8.5")
    assert t.args == {"max_seq_len_to_capture": 4096}


def test_rename_into_a_config_field_and_to_a_value() -> None:
    t = translate({"num_redundant_experts": 2, "eplb_window_size": 100, "disable_mm_preprocessor_cache": True,
                   "enable_multimodal_encoder_data_parallel": False, "worker_use_ray": True},
                  production="0.10.2", target="0.32.0")
    assert t.args == {"eplb_config": {"num_redundant_experts": 2, "window_size": 100}, "mm_processor_cache_gb": 0,
                      "distributed_executor_backend": "ray"}
    assert t.notes() == [
        "--num-redundant-experts does not exist in 0.32.0: it is --eplb-config's field 'num_redundant_experts' "
        "(stated in 0.10.2)",
        "--eplb-window-size does not exist in 0.32.0: it is --eplb-config's field 'window_size' (stated in 0.10.2)",
        "--disable-mm-preprocessor-cache does not exist in 0.32.0: --disable-mm-preprocessor-cache became "
        "--mm-processor-cache-gb=0 (stated in 0.10.1)",
        "--enable-multimodal-encoder-data-parallel does not exist in 0.32.0; production's "
        "enable_multimodal_encoder_data_parallel=False is the default there; dropped",
        "--worker-use-ray does not exist in 0.32.0: --worker-use-ray became --distributed-executor-backend='ray' "
        "(stated in 0.6.0)",
    ]
    # production's own eplb_config is kept and the renamed field added to it
    t = translate({"eplb_config": {"step_interval": 5}, "eplb_window_size": 10}, production="0.10.2", target="0.32.0")
    assert t.args == {"eplb_config": {"step_interval": 5, "window_size": 10}}


def test_a_switch_whose_replacement_takes_a_value_is_dropped() -> None:
    t = translate({"enable_reasoning": True}, production="0.9.2", target="0.32.0")
    assert t.args == {}
    assert t.notes() == ["--enable-reasoning does not exist in 0.32.0; vLLM 0.9.0 says to use --reasoning-parser "
                         "instead, which takes a value, not a switch; dropped"]
    t = translate({"enable_reasoning": True, "reasoning_parser": "deepseek_r1"}, production="0.9.2", target="0.32.0")
    assert t.args == {"reasoning_parser": "deepseek_r1"}


def test_replacement_given_too_wins() -> None:
    t = translate({"disable_log_requests": True, "enable_log_requests": True}, production="0.10.2", target="0.32.0")
    assert t.args == {"enable_log_requests": True}
    assert t.notes() == ["--disable-log-requests does not exist in 0.32.0; its replacement --enable-log-requests "
                         "(stated in 0.10.1) is set by production too; dropped"]


def test_downgrade_takes_the_older_name() -> None:
    t = translate({"enable_log_requests": True, "mm_processor_cache_gb": 4}, production="0.32.0", target="0.8.5")
    assert t.args == {"disable_log_requests": False}
    assert t.notes() == [
        "--enable-log-requests does not exist in 0.8.5; it replaced --disable-log-requests (stated in 0.10.1), "
        "which 0.8.5 has: --disable-log-requests=False",
        "--mm-processor-cache-gb does not exist in 0.8.5 (added in 0.10.1); dropped",
    ]


def test_unknown_and_server_arguments() -> None:
    t = translate({"enable_memory_budget": True, "max_num_seqz": 8, "host": "0.0.0.0", "port": 8000,
                   "api_key": "k", "max_model_len": 4096}, production="0.31.0", target="0.32.0")
    assert t.args == {"max_model_len": 4096}
    c = _by_name(t.changes)
    assert c["enable_memory_budget"].kind == "unknown" and c["enable_memory_budget"].note == (
        "--enable-memory-budget is not an argument of vLLM 0.32.0 nor of any vLLM release 0.6.0..0.34.0: "
        "vLLM's memory budget is --gpu-memory-utilization (or --kv-cache-memory-bytes); dropped")
    assert c["max_num_seqz"].note == ("--max-num-seqz is not an argument of vLLM 0.32.0 nor of any vLLM release "
                                      "0.6.0..0.34.0 (nearest: --max-num-seqs); dropped")
    for k in ("host", "port", "api_key"):
        assert c[k].kind == "dropped"
    assert c["host"].note == ("--host is an API server argument, not an engine argument; dropped "
                              "(the replay runs its own server)")
    # kebab-case keys and dashes are read alike
    assert translate({"--max-num-seqs": 3}, production=None, target="0.32.0").args == {"max_num_seqs": 3}


def test_model_is_the_replays_own() -> None:
    t = translate({"model": "meta-llama/Llama-3.1-8B", "served_model_name": "llama", "tokenizer": "t"},
                  production="0.32.0", target="0.32.0")
    assert t.args == {"tokenizer": "t"}
    assert _by_name(t.changes)["model"].note == ("production's model='meta-llama/Llama-3.1-8B' is not passed: the "
                                                 "replay chooses and names its own model")


CPU_CASES: list[tuple[str, Any, str | None]] = [
    ("tensor_parallel_size", 4, "the replay runs 1"),
    ("tensor_parallel_size", 1, None),
    ("pipeline_parallel_size", 2, "the replay runs 1"),
    ("data_parallel_size", 8, "the replay runs 1"),
    ("quantization", "awq_marlin", "its kernels are CUDA's; the replay's model is not quantized"),
    ("quantization", "fp8", "its kernels are CUDA's; the replay's model is not quantized"),
    ("kv_cache_dtype", "fp8_e5m2", "the CPU engine's KV cache takes the model's dtype"),
    ("kv_cache_dtype", "auto", None),
    ("gpu_memory_utilization", 0.95, "the CPU engine sizes its KV cache by VLLM_CPU_KVCACHE_SPACE"),
    ("cpu_offload_gb", 10, "it moves GPU memory to the host, which the CPU engine has none of"),
    ("distributed_executor_backend", "ray", "the CPU engine runs in one process"),
    ("distributed_executor_backend", "mp", None),
    ("enable_expert_parallel", True, "it is a GPU feature"),
    ("speculative_config", {"method": "ngram", "num_speculative_tokens": 4}, "the replay runs no draft model"),
    ("kv_transfer_config", {"kv_connector": "NixlConnector"}, "the replay runs one engine, connected to none"),
    ("compilation_config", {"cudagraph_mode": "FULL"}, "CUDA graphs and their compilation are a GPU engine's"),
    ("cudagraph_capture_sizes", [1, 2], "CUDA graphs and their compilation are a GPU engine's"),
    ("model", "Qwen/Qwen3-8B", "the replay chooses its own model"),
    ("load_format", "safetensors", "the replay chooses its own model"),
    ("enforce_eager", False, None),
    ("max_num_seqs", 512, None),
]


@pytest.mark.parametrize(("name", "value", "reason"), CPU_CASES)
def test_cpu_replacements(name: str, value: Any, reason: str | None) -> None:
    t = translate({name: value}, production="0.31.0", target="0.32.0", device="cpu")
    (c,) = t.changes
    if reason is None:
        assert c.kind == "kept" and t.args == {name: value} and t.notes() == []
    else:
        assert c.kind == "replaced_on_cpu" and t.args == {} and c.new_name is None
        shown = json.dumps(value) if isinstance(value, dict) else repr(value)
        assert c.note == f"production's {name}={shown} does not apply to the CPU engine; {reason}"


def test_cpu_note_and_rename_together() -> None:
    t = translate({"tensor_parallel_size": 4, "swap_space": 4, "cuda_graph_sizes": [8]}, production="0.11.1",
                  target="0.12.0", device="cpu")
    assert t.args == {}
    assert t.notes() == [
        "production's tensor_parallel_size=4 does not apply to the CPU engine; the replay runs 1",
        "production's swap_space=4 does not apply to the CPU engine; it moves GPU memory to the host, which the "
        "CPU engine has none of",
        "production's cuda_graph_sizes=[8] does not apply to the CPU engine; CUDA graphs and their compilation "
        "are a GPU engine's",
    ]


def test_target_known_overrides_the_catalogue() -> None:
    # the target environment's own --help: it has --swap-space (the catalogue's 0.32.0 has not) and lacks
    # --max-num-seqs (the catalogue's has)
    known = ["swap-space", "max-model-len", "host", "port", "enable-log-requests"]
    t = translate({"swap_space": 4, "max_num_seqs": 8, "max_model_len": 1024, "disable_log_requests": True},
                  production="0.10.2", target="0.32.0", target_known=known)
    assert t.args == {"swap_space": 4, "max_model_len": 1024, "enable_log_requests": False}
    assert _by_name(t.changes)["max_num_seqs"].note == (
        "--max-num-seqs does not exist in 0.32.0 by its own argument list (the catalogue lists it for 0.32.0); "
        "dropped")


def test_target_known_for_a_version_the_catalogue_lacks() -> None:
    t = translate({"max_num_seqs": 8, "bogus_arg": 1}, production="0.32.0", target="0.99.0",
                  target_known=["max-num-seqs"])
    assert t.args == {"max_num_seqs": 8} and t.caveats == []
    assert t.notes() == ["--bogus-arg is not an argument of vLLM 0.99.0 (by its own argument list) nor of any "
                         "vLLM release 0.6.0..0.34.0; dropped"]
    t = translate({"max_num_seqs": 8}, production="0.32.0", target="0.99.0")
    assert t.caveats == ["vLLM 0.99.0 is not in the catalogue (0.6.0..0.34.0): its arguments are taken as 0.34.0's"]


def test_catalogue_is_passed_or_loaded_once() -> None:
    c = load()
    assert load() is c
    t = translate({"max_num_seqs": 8}, production="0.32.0", target="0.32.0", catalogue=c)
    assert t.args == {"max_num_seqs": 8}
