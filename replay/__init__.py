"""replay: postmortem replay and forensics for vLLM out-of-memory incidents.

The package is laid out as its pipeline: ``trace`` (the request format and its importers),
``record`` (evidence -> incident bundle), ``bundle`` (the on-disk contract), ``engine`` and
``drive`` (a real vLLM server and the open-loop driver), ``analysis`` (pure functions on polars
frames), ``report`` (HTML, postmortem, Perfetto, CI gate), ``commands`` (thin CLI adapters).
"""

__version__ = "0.1.0"
