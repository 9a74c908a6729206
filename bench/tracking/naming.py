"""MLflow run naming and descriptions: the experiment's kind and description, MLflow's system tags,
sweep run names, UI links, run descriptions (:data:`NOTE`) and the report page; MLflow-safe keys and tags."""

from __future__ import annotations

import math
import time
import urllib.parse
from functools import lru_cache
from pathlib import Path
from typing import Any

from bench.core.metadata import git_commit

#: the run tag the MLflow UI shows (and edits) as a run's description; markdown (GitHub flavour, tables too)
NOTE = "mlflow.note.content"
#: first paragraph of a sweep parent's description once ``report`` logged its report there (kept when the
#: sweep's description is rewritten, e.g. by a rerun of a finished sweep)
REPORT_POINTER = ("Report (factor effects with intervals, per-cell speedups, phases, plots): artifact "
                  "`report/report.md`.")
#: experiment tag that tells the MLflow 3 UI which kind of experiment it shows (classic ML: "Training runs")
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
#: URL query that makes MLflow 3.17's UI open an experiment on its model-training view (it ignores
#: :data:`EXPERIMENT_KIND`; the link chooses the view, else what the browser chose last, default GenAI)
ML_VIEW = "workflowType=machine_learning"


def experiment_description(name: str) -> str:
    """Markdown description of the experiment ``name`` (the MLflow UI shows it above the runs)."""
    return (f"GRPO ablation benchmark `{name}` (`run_bench.py`). One **parent run per sweep** (tag "
            "`bench.kind = sweep`; its description holds the sweep's summary table, its metrics "
            "`speedup.<cell>` and `step_time_s.<cell>`), with a **child run per cell and repeat** "
            "(`bench.kind = cell`): params `factor.*` are the factor levels (`n/a`: not applicable), metrics "
            "are the per-step series of the run and its summary (`step_time_s`, `rollout_share`, `free_ratio`, "
            "...), tags `evidence.*` say how each factor was seen to take effect. Tune studies "
            "(`bench.kind = tune`, a child per trial) and gate runs (`bench.kind = gate`) live here too. "
            "Filter children with e.g. `tags.bench.kind = 'cell' and params.factor.dynamic_bsz = '1'`.")


@lru_cache(maxsize=1)
def system_tags() -> dict[str, str]:
    """MLflow's system tags for a run this harness creates, as the UI shows them: ``mlflow.user`` (and any
    other tag of MLflow's run-context providers but git's), ``mlflow.source.name`` = ``run_bench.py``,
    ``mlflow.source.type`` = ``LOCAL`` and the project's git commit, branch and remote URL (MLflow's
    ``mlflow.source.git.*``; credentials stripped by MLflow) when it is a git checkout.

    :class:`mlflow.MlflowClient` sets none of them (only MLflow's fluent API does); without them the UI's
    User, Source and Git commit columns stay empty.
    """
    from mlflow.tracking.context.git_context import GitRunContext
    from mlflow.tracking.context.registry import resolve_tags
    from mlflow.utils.git_utils import get_git_branch, get_git_repo_url

    own = {"mlflow.source.name": "run_bench.py", "mlflow.source.type": "LOCAL"}
    sha = git_commit().removesuffix("+dirty")
    if sha != "unknown":  # the project's repository, not that of whatever script imported the harness
        root = str(Path(__file__).resolve().parents[2])
        own["mlflow.source.git.commit"] = sha
        for key, value in (("mlflow.source.git.branch", get_git_branch(root)),
                           ("mlflow.source.git.repoURL", get_git_repo_url(root))):
            if value:
                own[key] = value
    return {k: str(v) for k, v in resolve_tags(own, ignore=[GitRunContext]).items()}


def sweep_run_name(matrix: str, created_at: float | None, commit: str | None) -> str:
    """A sweep parent run's name: ``<matrix> <YYYY-MM-DD HH:MM> <git short sha>`` (local time of
    ``created_at``, epoch seconds; the sha's first 7 characters, ``+dirty`` kept; no sha part when unknown)."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(created_at if created_at is not None else time.time()))
    sha = str(commit or "")
    dirty = sha.endswith("+dirty")
    sha = sha.removesuffix("+dirty")
    short = "" if not sha or sha == "unknown" else " " + sha[:7] + ("+dirty" if dirty else "")
    return f"{matrix} {when}{short}"


def run_url(tracking_uri: str, experiment_id: str | None, run_id: str | None = None) -> str | None:
    """The MLflow UI link of an experiment (or of one of its runs) on an ``http(s)`` tracking server, opening
    on the model-training view (:data:`ML_VIEW`); ``None`` for other stores (no UI at the URI)."""
    if not tracking_uri.lower().startswith(("http://", "https://")) or not experiment_id:
        return None
    page = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{tracking_uri.rstrip('/')}/{page}?{ML_VIEW}"


def markdown_html(md: str, base: Path, title: str = "report") -> str:
    """A standalone HTML page of the markdown text ``md`` (tables and fenced code rendered by the
    ``markdown`` package) with every local image (``![..](file.png)``, relative to ``base``) embedded as a
    base64 ``data:`` URI, so that the MLflow UI's artifact viewer shows it with its plots. Images that are
    not files under ``base`` are left as they are."""
    import base64
    import html
    import mimetypes
    import re

    import markdown

    body = markdown.markdown(md, extensions=["tables", "fenced_code"])

    def embed(m: re.Match) -> str:
        src = html.unescape(m.group(2))
        path = (base / urllib.parse.unquote(src)).resolve()
        if "://" in src or not path.is_file():
            return m.group(0)
        kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        return f'{m.group(1)}"data:{kind};base64,{base64.b64encode(path.read_bytes()).decode()}"'

    body = re.sub(r'(<img[^>]*?\ssrc=)"([^"]+)"', embed, body)
    style = ("body{font-family:sans-serif;max-width:1100px;margin:1em auto;padding:0 1em}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n{body}\n</body></html>\n")


def _ms(t: float | None) -> int | None:
    """Epoch seconds -> epoch milliseconds (MLflow's unit); ``None`` stays ``None``."""
    return None if t is None else int(round(float(t) * 1000))


def note(text: str) -> str:
    """``text`` fit for :data:`NOTE`: whole when it fits MLflow's tag limit (``MAX_TAG_VAL_LENGTH``, 8000
    characters), else cut at a line end (a markdown table stays well formed) with a closing remark."""
    from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

    if len(text) <= MAX_TAG_VAL_LENGTH:
        return text
    remark = f"\n\n... (cut at MLflow's {MAX_TAG_VAL_LENGTH}-character limit; the full text is in the run's artifacts)"
    cut = text[:MAX_TAG_VAL_LENGTH - len(remark)]
    if "\n" in cut:
        cut = cut[:cut.rindex("\n")]
    return cut.rstrip() + remark


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _tag(v: Any) -> str:
    s = v if isinstance(v, str) else __import__("json").dumps(v, sort_keys=True, default=str)
    return s[:5000]



def mlflow_key(k: str) -> str:
    """MLflow-safe metric/param key (letters, digits, ``_-./ :`` kept; others -> ``_``)."""
    return "".join(c if c.isalnum() or c in "_-./ :" else "_" for c in str(k))
