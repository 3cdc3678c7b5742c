"""The ``replay-trace/1`` request format: one header line, then one request per line (JSONL)."""
