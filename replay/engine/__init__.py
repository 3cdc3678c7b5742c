"""The engine under test: per-version vLLM environments, the tiny local model, the server process.

``replay`` never imports vllm or torch: each vLLM version lives in its own virtualenv and runs as
its OpenAI-compatible server process, driven over HTTP.
"""
