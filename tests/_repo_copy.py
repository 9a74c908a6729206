"""Copy of a git checkout for the tests that run a copy of this repository (issue 31).

Only tracked files travel (``git ls-files``: the index, so a new file that is ``git add``-ed counts), each as it
is in the working tree, so uncommitted edits of tracked files are part of the copy. Untracked and ignored files
never are: a local virtual environment, results, caches or a stray scratch file must not change what a test
sees (``git ls-files -co --exclude-standard`` copied untracked files too). So a new module must be
``git add``-ed before these tests can import it from the copy.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def tracked_files(root: Path) -> list[str]:
    """The paths (relative to ``root``) of the files git tracks in the checkout ``root``."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached"], check=True,
                         capture_output=True).stdout
    return sorted({rel for rel in out.decode("utf-8", "surrogateescape").split("\0") if rel})


def copy_tracked(root: Path, dest: Path) -> list[str]:
    """Copy the tracked files of the git checkout ``root`` into ``dest`` as they are in its working tree.

    A tracked file deleted from the working tree, a symlink or anything else that is not a plain file is left
    out. Returns the relative paths copied."""
    copied = []
    for rel in tracked_files(root):
        src = Path(root) / rel
        if src.is_symlink() or not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
        copied.append(rel)
    return copied


#: a slowdown planted in the embedded engine's update phase (the interleaved gate's and bisect's real tests): the
#: line it follows, and that line followed by a marker file in the run folder and a 0.6 s sleep per step
SLOW_PATCH = (
    '    with phase(timing, "update_actor", tr.device):\n',
    '    with phase(timing, "update_actor", tr.device):\n'
    '        import pathlib as _pl\n'
    '        _pl.Path("code_marker_slow_commit").write_text(__file__)\n'
    '        time.sleep(0.6)\n',
)
#: the author and committer of the tests' commits
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(repo: Path, *args: str) -> str:
    """``git -C repo ARGS``'s output (raises ``CalledProcessError`` on failure), with :data:`GIT_ENV`."""
    import os

    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout


def plant_slowdown(repo: Path, relative: float | None = None) -> None:
    """Apply :data:`SLOW_PATCH` to the embedded engine's step in the checkout ``repo`` (its anchor once there).

    ``relative``: sleep that fraction of the time the step has taken so far (generation and log-probs) instead of
    0.6 s, so the slowdown keeps its relative size however busy the machine is."""
    step = repo / "bench/engines/embedded/step.py"
    text = step.read_text()
    assert text.count(SLOW_PATCH[0]) == 1, "anchor of the planted slowdown not found"
    patch = SLOW_PATCH[1]
    if relative is not None:
        patch = patch.replace("time.sleep(0.6)", f"time.sleep({relative!r} * (time.perf_counter() - t_step))")
    step.write_text(text.replace(SLOW_PATCH[0], patch))


def short_gate_matrix(name: str, repeats: int) -> str:
    """The matrix text of the real interleaved-gate tests (gate vs a git revision, bisect): one embedded cell,
    3 short steps, one intra-op thread, ``repeats`` blocks at most."""
    return f"""name: {name}
engine: embedded
platform: cpu
base:
  steps: 3
  warmup_steps: 1
  profile_steps: []
  train_batch_size: 4
  n: 2
  ppo_mini_batch_size: 4
  micro_batch_size_per_gpu: 2
  max_prompt_length: 160
  max_response_length: 24
  timeout_s: 300
  seed: 0
  env: {{OMP_NUM_THREADS: "1", MKL_NUM_THREADS: "1"}}
factors:
  dynamic_bsz: [on]
repeats: {repeats}
"""
