"""Trace format ``toytrace``: ``toy_free.txt`` with one ``<step> <free ratio>`` line per profiled step, and
``toy_ops.txt`` with one ``<step> <operator> <calls> <self time in us>`` line per operator and step."""

from __future__ import annotations

from pathlib import Path

from bench.measure.formats import Measurements, Reader, ReadOptions, StepOps


class ToyTraceReader(Reader):
    """``toy_free.txt``: the Free ratio per profiled step; ``toy_ops.txt``: the operators of every step (they
    feed the report's "where it acts", the top operators and the categories)."""

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

    def step_ops(self, run_dir: Path, step: int, source: str, memo: dict) -> StepOps | None:
        path = run_dir / "toy_ops.txt"
        if not path.is_file():
            return None
        rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
        ops = [(name, int(calls), float(us)) for s, name, calls, us in rows if int(s) == step]
        return StepOps(source="toy_ops.txt", basis="cpu", ops=ops) if ops else None
