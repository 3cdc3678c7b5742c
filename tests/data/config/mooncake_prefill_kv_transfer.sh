export MOONCAKE_CONFIG_PATH=/app/mooncake_config.json
echo "{
    \"local_hostname\": \"$POD_IP\",
    \"metadata_server\": \"redis://redis:6379\",
    \"master_server_address\": \"mooncake-master:30089\",
    \"protocol\": \"tcp\",
    \"device_name\": \"\",
    \"global_segment_size\": 32212254720
}" > ${MOONCAKE_CONFIG_PATH}

VLLM_USE_V1=0 python3 -m vllm.entrypoints.openai.api_server \
  --model Qwen/Qwen3-8B \
  --port 8100 \
  --max-model-len 10000 \
  --gpu-memory-utilization 0.8 \
  --block-size 128 \
  --kv-transfer-config '{"kv_connector":"MooncakeStoreConnector","kv_role":"kv_producer","kv_buffer_device":"npu"}'
