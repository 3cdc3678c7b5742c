"""What ``replay record`` is told beside its files: how to read times, kinds and hosts where the
evidence does not say."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RecordOptions:
    year: int | None = None
    tz_offset_s: int = 0
    at: str | None = None  # when evidence without times of its own was taken, or when a run of relative times began
    at_files: dict[str, str] = field(default_factory=dict)  # file (path or name) -> its own --at
    as_kind: dict[str, str] = field(default_factory=dict)
    keep_prompts: bool = False
    keep_quarantine_text: bool = False  # the text of lines quarantined (a request line's prompt, say); with keep_prompts too
    nvsmi_columns: str | None = None
    rows_interval_s: float = 1.0  # how far apart rows without times were taken (dcgmi dmon's -d)
    host: str | None = None  # the node vLLM ran on, where GPU evidence covers several
    gpu_instance: str | None = None  # the MIG instance vLLM ran in (DCGM's GPU_I_ID, or GPU:GPU_I_ID)
    metrics: list[str] = field(default_factory=list)
    clock_offsets_us: dict[str, int] = field(default_factory=dict)  # file (path or name) -> its clock ahead by
    progress: Callable[[int], None] | None = None  # called with the size of each piece of log read
    stage: Callable[[str], None] | None = None  # told what the recorder does once the evidence is read
    spill: Path | None = None  # a folder of the recorder's own where a parser may leave samples on disk rather
    # than hold them (``Parsed.on_disk``); None: every sample is held

    def clock_offset_us(self, path: Path) -> int:
        return self.clock_offsets_us.get(str(path), self.clock_offsets_us.get(path.name, 0))

    def for_file(self, path: Path) -> RecordOptions:
        """These options as one file is read: its own --at (FILE=TIME) in place of the others'."""
        own = self.at_files.get(str(path), self.at_files.get(path.name))
        return self if own is None else dataclasses.replace(self, at=own)
