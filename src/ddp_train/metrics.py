"""<run-dir>/metrics.jsonl: one JSON object per line, appended by rank 0 and flushed each time.

Record types: "run" at every start (metadata), "epoch" after each epoch, "stopped" when a
signal ended the run early, "summary" at the end. Plotting and benchmark tools read it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

METRICS_NAME = "metrics.jsonl"


class MetricsWriter:
    def __init__(self, run_dir: str | Path, enabled: bool):
        self.path = Path(run_dir) / METRICS_NAME
        self.enabled = enabled

    def write(self, record_type: str, **fields: Any) -> None:
        if not self.enabled:
            return
        record = {"type": record_type, "time": round(time.time(), 3), **fields}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=False) + "\n")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
