source myenv/bin/activate
# 140.77 seconds (with new improvement! batching really works with the embedding model!!!!)
vllm serve --port 8070 --host 0.0.0.0 --trust-remote-code --tensor-parallel-size 1 --max-model-len 2048 --max-num-batched-tokens 8192 --task embed TIGER-Lab/VLM2Vec-Full
# 145.53 seconds 
# second run: 140.75 seconds
# (with new improvement! batching really works with the embedding model!!!!)
vllm serve --port 8070 --host 0.0.0.0 --trust-remote-code --tensor-parallel-size 1 --max-model-len 8192 --max-num-batched-tokens 8192 --task embed TIGER-Lab/VLM2Vec-Full
