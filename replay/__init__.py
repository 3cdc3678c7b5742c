"""replay: postmortem replay and forensics for vLLM out-of-memory incidents.

The package is laid out as its pipeline: ``trace`` (the request format and its importers),
``record`` (evidence -> incident bundle), ``bundle`` (the on-disk contract), ``engine`` and
``drive`` (a real vLLM server and the open-loop driver), ``analysis`` (pure functions on polars
frames), ``report`` (HTML, postmortem, Perfetto, CI gate), ``commands`` (thin CLI adapters).
"""

import os

# polars allocates through its own jemalloc (symbols prefixed '_rjem_', so configured by this variable),
# which by default holds freed pages for seconds before it gives them back. The importers and the
# recorder stream a file in pieces, freeing each piece's frames as the next is made: held that long,
# the freed pages made memory grow with the length of the file (a 10M-row import peaked 1.5x above a
# 1M-row one). Given back at once, every piece faulted its pages in anew: recording a 1 GiB log took
# 1.1M page faults and 6 s of system time. A second's hold keeps both down (10M/1M rows 1.1-1.2x;
# the 1 GiB log 0.4-0.6M faults, 4-4.5 s). Its per-thread caches are off: a thread's cache holds the
# small blocks it freed, and while the request join fed the Parquet sink (a Python source that polars'
# own threads read) memory grew by ~1.2 MiB a bucket, to the recording's peak at a fleet's day (a fleet's
# 4 logs: 246 -> 363 MiB over 97 buckets with them, 206-237 MiB throughout without; a fleet's day records
# no slower, a tenth of it ~10 % slower). It must be set before polars is first imported, which is why it
# is here; a setting of the user's own wins. (`replay record` holds them longer: ``malloc.hold_freed_pages``.)
POLARS_MALLOC_CONF = "dirty_decay_ms:{},muzzy_decay_ms:0,tcache:false"  # (with how long freed pages are held, ms)
users_polars_malloc_conf = os.environ.get("_RJEM_MALLOC_CONF")
os.environ.setdefault("_RJEM_MALLOC_CONF", POLARS_MALLOC_CONF.format(1000))

__version__ = "0.1.0"
