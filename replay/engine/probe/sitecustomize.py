"""The torch allocator probe, loaded into every Python process of the engine under test.

``replay run`` puts this directory first on the engine's PYTHONPATH and sets REPLAY_PROBE_DIR, so
Python imports this file at start-up in the API server, the engine core and every worker (replay
itself never imports torch or vllm). It imports nothing heavy: a daemon thread waits until the
process has imported torch *and* initialised CUDA itself, then samples the caching allocator
(reserved and allocated bytes per device) into ``probe-<pid>.jsonl``, and attaches an OOM observer
that dumps a memory snapshot (``oom-snapshot-<pid>.pickle``, for https://pytorch.org/memory_viz) at
the moment of a CUDA OOM. It only reads allocator statistics, never changes GPU state, and swallows
its own errors: the engine must behave exactly as without it.
"""

import json
import os
import sys
import threading
import time

_DIR = os.environ.get("REPLAY_PROBE_DIR")


def _write(fh, obj):
    fh.write(json.dumps(obj) + "\n")
    fh.flush()


def _attach(torch, fh, pid):
    """OOM observer (and, if asked, allocation history) once CUDA is up in this process."""
    if os.environ.get("REPLAY_PROBE_HISTORY") == "1":
        try:
            torch.cuda.memory._record_memory_history(max_entries=int(os.environ.get("REPLAY_PROBE_HISTORY_ENTRIES", "100000")))
        except Exception as e:  # noqa: BLE001 - the probe must never break the engine
            _write(fh, {"kind": "probe_error", "where": "record_memory_history", "error": repr(e)[:300]})

    def on_oom(device, alloc, device_alloc, device_free):
        snap = os.path.join(_DIR, f"oom-snapshot-{pid}.pickle")
        ok = False
        try:
            import pickle
            with open(snap, "wb") as out:
                pickle.dump(torch.cuda.memory._snapshot(), out)
            ok = True
        except Exception as e:  # noqa: BLE001
            _write(fh, {"kind": "probe_error", "where": "snapshot", "error": repr(e)[:300]})
        _write(fh, {"kind": "oom", "t": time.time(), "pid": pid, "device": device, "tried_bytes": alloc,
                    "device_allocated_bytes": device_alloc, "device_free_bytes": device_free,
                    "snapshot": os.path.basename(snap) if ok else None})

    try:
        torch._C._cuda_attach_out_of_memory_observer(on_oom)
        return True
    except Exception as e:  # noqa: BLE001
        _write(fh, {"kind": "probe_error", "where": "attach_oom_observer", "error": repr(e)[:300]})
        return False


def _run():
    pid = os.getpid()
    interval = float(os.environ.get("REPLAY_PROBE_INTERVAL_S", "0.25"))
    with open(os.path.join(_DIR, f"probe-{pid}.jsonl"), "a") as fh:
        _write(fh, {"kind": "hello", "t": time.time(), "pid": pid, "argv": [os.path.basename(a) for a in sys.argv[:3]]})
        attached = False
        uuids = {}
        while True:
            torch = sys.modules.get("torch")
            cuda = getattr(torch, "cuda", None) if torch is not None else None
            try:
                if cuda is not None and cuda.is_initialized():
                    if not attached:
                        attached = True
                        _attach(torch, fh, pid)
                        for d in range(cuda.device_count()):
                            uuids[d] = str(getattr(cuda.get_device_properties(d), "uuid", "") or "")
                        _write(fh, {"kind": "cuda", "t": time.time(), "pid": pid, "devices": uuids})
                    t = time.time()
                    for d in range(cuda.device_count()):
                        _write(fh, {"kind": "sample", "t": t, "device": d, "uuid": uuids.get(d, ""),
                                    "reserved": int(cuda.memory_reserved(d)), "allocated": int(cuda.memory_allocated(d))})
            except Exception as e:  # noqa: BLE001
                _write(fh, {"kind": "probe_error", "where": "sample", "error": repr(e)[:300]})
                time.sleep(5)
            time.sleep(interval)


if _DIR and os.path.isdir(_DIR):
    try:
        threading.Thread(target=_run, name="replay-allocator-probe", daemon=True).start()
    except Exception:  # noqa: BLE001
        pass
