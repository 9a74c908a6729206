"""Trace format ``toytrace``: ``toy_free.txt`` with one ``<step> <free ratio>`` line per profiled step."""

from __future__ import annotations

from pathlib import Path

from bench.measure.formats import Measurements, Reader, ReadOptions


class ToyTraceReader(Reader):
    """``toy_free.txt``: one ``<step> <free ratio>`` line per profiled step."""

    name = "toytrace"

    def detect(self, run_dir: Path) -> bool:
        return (run_dir / "toy_free.txt").is_file()

    def read(self, run_dir: Path, options: ReadOptions) -> Measurements:
        out = Measurements()
        for line in (run_dir / "toy_free.txt").read_text().splitlines():
            step, free = line.split()
            out.free.append((int(step), {"kind": self.name, "source": "toy_free.txt", "free_ratio": float(free),
                                         "basis": "toy_free.txt"}))
        return out
