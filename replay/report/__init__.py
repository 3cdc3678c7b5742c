"""Presentation only: HTML report, postmortem draft, Perfetto export, CI gate. No analysis here."""
