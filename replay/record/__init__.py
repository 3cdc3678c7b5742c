"""Recording: evidence files (and live endpoints) -> one incident bundle on one UTC timeline."""
