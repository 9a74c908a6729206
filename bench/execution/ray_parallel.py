"""Run the runs of one block at once on distinct nodes of an existing Ray cluster (``--parallel``).

:class:`RayNodesExecutor` runs each run as a Ray job (:class:`bench.execution.ray_executor.RayJobExecutor`) pinned
to one node of the cluster:

- **one run per node, never two on one node**: a block's runs are split among the nodes
  (:meth:`RayNodesExecutor.assign`) and each node's thread runs its share one after another; the job's
  entrypoint is pinned with the label selector ``ray.io/node-id = <node>`` (Ray's job manager schedules
  the job's driver there). When the cluster's nodes carry the custom resource :data:`SLOT_RESOURCE`
  (``ray start --resources='{"bench_node": 1}'`` on every node), each job also asks for one unit of it,
  so Ray itself refuses a second such job on a node (other harnesses sharing the cluster included), and
  only the nodes that have it are used.
- **blocks stay sequential**: :meth:`RayNodesExecutor.run_block` returns when every run of a block has
  ended, so a time block still means "these runs ran at the same time", and the next block starts after
  it. Cells rotate over the nodes from block to block (a Latin square when there are as many cells as
  nodes); the node of every run is recorded (:attr:`bench.core.process.ExecResult.node`, Ray's
  ``driver_node_id``) and enters the report's model as a blocking factor beside the time block
  (:func:`bench.stats.effects.fit_effects`), so a faster node cannot pose as an effect.
- **the harness stays sequential**: the node threads share one lock, let go only while a thread waits
  for its Ray job; skip checks, records, MLflow and the console run one thread at a time, as in a
  sequential sweep.
- **failures and interruption**: a failed run is a record like any other (the block goes on); an
  exception in the harness (Ctrl-C, SIGTERM, a full disk) sets the shared ``cancel`` event, every
  thread stops its Ray job (``stop_job``) and the exception is raised again once they have: no job is
  left running, runs that finished keep their records, and a rerun resumes the rest.

``slots`` = ``--parallel N`` or ``auto`` (every usable alive node, counted when the sweep starts). A
run has the node to itself only among the jobs of harnesses: other work on the node is not seen
(:data:`SLOT_RESOURCE` makes Ray enforce one benchmark run per node across harnesses).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from bench.core.errors import BenchError
from bench.core.process import ExecResult
from bench.execution.blocks import split_blocks
from bench.execution.executors import ResolvedLaunch
from bench.execution.ray_executor import RayJobExecutor, resolve_auth_token

#: custom Ray resource that marks a node for benchmark runs (one unit per node); optional
SLOT_RESOURCE = "bench_node"

T = TypeVar("T")


@dataclass(frozen=True)
class ClusterNode:
    """An alive node of the cluster: Ray node ``id`` (hex), ``ip``, a short ``name`` (first 8 hex digits of
    the id), whether it is the head, and how many :data:`SLOT_RESOURCE` units it offers (0: none)."""

    id: str
    ip: str
    name: str
    is_head: bool
    slots: float = 0.0

    def as_dict(self) -> dict[str, str]:
        """``{"id", "ip", "name"}``: what a record keeps of the node."""
        return {"id": self.id, "ip": self.ip, "name": self.name}


def cluster_nodes(address: str) -> list[ClusterNode]:
    """The alive nodes of the cluster whose dashboard is at ``address`` (Ray's state API), head first.

    The token of :func:`bench.execution.ray_executor.resolve_auth_token` is sent as with job submission.

    Raises:
        BenchError: the state API cannot be reached or answers with an error.
    """
    from ray.util.state import StateApiClient
    from ray.util.state.common import ListApiOptions, StateResource

    token, _ = resolve_auth_token()
    headers = {"Content-Type": "application/json", **({"authorization": f"Bearer {token}"} if token else {})}
    try:
        client = StateApiClient(address, headers=headers)
        found = client.list(StateResource.NODES, options=ListApiOptions(detail=True, limit=10000, timeout=30),
                            raise_on_missing_output=False)
    except Exception as exc:  # ConnectionError, RayStateApiException, ValueError ...
        msg = " ".join(str(exc).split())[:300]
        raise BenchError(f"--ray-address {address}: cannot list the cluster's nodes: {msg}") from None
    nodes = []
    for n in found:
        get = (lambda k: n.get(k)) if isinstance(n, dict) else (lambda k: getattr(n, k, None))
        if str(get("state")).upper() != "ALIVE":
            continue
        nid = str(get("node_id"))
        nodes.append(ClusterNode(id=nid, ip=str(get("node_ip") or ""), name=nid[:8], is_head=bool(get("is_head_node")),
                                 slots=float((get("resources_total") or {}).get(SLOT_RESOURCE, 0.0))))
    return sorted(nodes, key=lambda n: (not n.is_head, n.ip, n.id))


def usable_nodes(nodes: Sequence[ClusterNode]) -> tuple[list[ClusterNode], bool]:
    """The nodes benchmark runs may use and whether they carry :data:`SLOT_RESOURCE`: the nodes with at
    least one unit of it when any node has it, else every node."""
    marked = [n for n in nodes if n.slots >= 1]
    return (marked, True) if marked else (list(nodes), False)


def parallel_slots(requested: str | int, nodes: Sequence[ClusterNode], address: str) -> int:
    """How many runs go at once: ``requested`` (``auto`` = every usable node, or a count >= 1).

    Raises:
        BenchError: a value that is neither ``auto`` nor a count >= 1, a cluster without usable nodes, or
            more runs at once than usable nodes (two runs would share a node).
    """
    if not nodes:
        raise BenchError(f"--ray-address {address}: the cluster has no alive node to run on")
    if str(requested).strip().lower() == "auto":
        return len(nodes)
    try:
        n = int(str(requested))
    except ValueError:
        n = 0
    if n < 1:
        raise BenchError(f"--parallel {requested}: allowed values: auto, or a number of runs at once >= 1")
    if n > len(nodes):
        raise BenchError(f"--parallel {n}: the cluster at {address} has {len(nodes)} usable alive node(s) "
                         f"({', '.join(f'{x.name} {x.ip}' for x in nodes)}); one run per node: allowed 1-{len(nodes)} "
                         "or auto")
    return n


class NodePool:
    """Nodes free for a run; :meth:`take` blocks until one is free (or ``cancel`` is set)."""

    def __init__(self, nodes: Sequence[ClusterNode], cancel: threading.Event):
        self._free = list(nodes)
        self._cond = threading.Condition()
        self._cancel = cancel
        self.busy: set[str] = set()

    def take(self) -> ClusterNode:
        """The first free node (in pool order), marked busy.

        Raises:
            KeyboardInterrupt: ``cancel`` was set while waiting.
        """
        with self._cond:
            while not self._free:
                if self._cancel.is_set():
                    raise KeyboardInterrupt("sweep interrupted")
                self._cond.wait(0.5)
            node = self._free.pop(0)
            assert node.id not in self.busy, f"node {node.name} handed out twice"
            self.busy.add(node.id)
            return node

    def hold(self, node: ClusterNode) -> None:
        """Take this very node (a node thread of a block); it must be free."""
        with self._cond:
            assert node.id not in self.busy and any(n.id == node.id for n in self._free), \
                f"node {node.name} handed out twice"
            self._free = [n for n in self._free if n.id != node.id]
            self.busy.add(node.id)

    def give_back(self, node: ClusterNode, order: Sequence[ClusterNode]) -> None:
        """Return ``node`` to the pool (kept in the order of ``order``)."""
        with self._cond:
            self.busy.discard(node.id)
            rank = {n.id: i for i, n in enumerate(order)}
            self._free = sorted([*self._free, node], key=lambda n: rank.get(n.id, len(rank)))
            self._cond.notify()


class RayNodesExecutor:
    """Runs launches as Ray jobs on distinct nodes of the cluster at ``address``, ``slots`` at a time.

    Args:
        address: Ray dashboard / job server address (``--ray-address``).
        parallel: ``auto`` or the number of runs at once (:func:`parallel_slots`).
        ray: a ready :class:`RayJobExecutor` (tests); by default one is created for ``address``.
        nodes: the cluster's nodes (tests); by default listed with :func:`cluster_nodes`.

    Raises:
        BenchError: the cluster cannot be reached, has no usable node, or fewer than ``parallel``.
    """

    name = "ray"

    def __init__(self, address: str, parallel: str | int = "auto", *, ray: RayJobExecutor | None = None,
                 nodes: Sequence[ClusterNode] | None = None, poll_s: float = 1.0):
        self.address = address
        self.ray = ray or RayJobExecutor(address, poll_s=poll_s)
        usable, self.uses_slot_resource = usable_nodes(cluster_nodes(address) if nodes is None else nodes)
        self.slots = parallel_slots(parallel, usable, address)
        self.nodes = usable[: self.slots]
        self.cancel = self.ray.cancel
        self.pool = NodePool(self.nodes, self.cancel)
        self._local = threading.local()
        self._lock = threading.Lock()  # the harness lock: one thread at a time outside a Ray job

    def describe(self) -> str:
        """One line for the console: runs at once and the nodes used."""
        how = f"custom resource {SLOT_RESOURCE!r} + node label" if self.uses_slot_resource else "node label"
        return (f"{self.slots} run(s) at once, one per Ray node ({how}): "
                + ", ".join(f"{n.name} ({n.ip}{', head' if n.is_head else ''})" for n in self.nodes))

    def _pinned(self, node: ClusterNode) -> RayJobExecutor:
        return self.ray.pinned(node.as_dict(), {SLOT_RESOURCE: 1.0} if self.uses_slot_resource else None)

    def execute(self, launch: ResolvedLaunch) -> ExecResult:
        """Run one launch on a node: the node this thread holds inside :meth:`run_block` (the harness lock is
        let go while the job runs, so the other runs of the block proceed), else the first free node (a
        sweep that is not blocked runs one run at a time)."""
        held = getattr(self._local, "executor", None)
        if held is None:
            node = self.pool.take()
            try:
                return self._pinned(node).execute(launch)
            finally:
                self.pool.give_back(node, self.nodes)
        self._lock.release()
        try:
            return held.execute(launch)
        finally:
            self._lock.acquire()

    def assign(self, block: Sequence[tuple[T, int]]) -> list[list[tuple[T, int]]]:
        """Per node of :attr:`nodes`, the runs of ``block`` it runs (in the block's order).

        Cyclic assignment: the cell of rank ``i`` among the block's cell ids (sorted) runs on node
        ``(i + k) mod slots`` in block ``k``, so a cell moves to the next node from one block to the next.
        With as many cells as nodes and a multiple of that many blocks this is a Latin square (rows = time
        blocks, columns = nodes, letters = cells; Montgomery, *Design and Analysis of Experiments*, 9th ed.,
        sec. 4.2): every cell runs on every node equally often, so node and cell are orthogonal and the
        node factor of the model costs no precision on the effects; otherwise each cell still visits the
        nodes in turn, never one node only by chance.
        """
        ids = sorted({str(getattr(spec, "cell_id", spec)) for spec, _ in block})
        per_node: list[list[tuple[T, int]]] = [[] for _ in self.nodes]
        for spec, k in block:
            per_node[(ids.index(str(getattr(spec, "cell_id", spec))) + int(k)) % self.slots].append((spec, k))
        return per_node

    def run_block(self, items: Sequence[tuple[T, int]], run_one: Callable[[T, int], None]) -> None:
        """Call ``run_one(spec, repeat)`` for every item; the items of one block (consecutive items with the
        same repeat, :func:`split_blocks`) at once, one thread per node running the block's runs assigned to
        that node (:meth:`assign`) one after another; the next block starts when every run of the previous
        one has ended.

        ``run_one`` runs in the node's thread (its :meth:`execute` goes to that node) holding the harness
        lock: everything the harness does around a run (skip checks, records, MLflow, console) runs one
        thread at a time, exactly as in a sequential sweep; only the Ray jobs overlap.

        Raises:
            BaseException: what a ``run_one`` raised, or an interruption of the calling thread (Ctrl-C,
                SIGTERM) — after every other run's Ray job was stopped and its thread ended.
        """
        for block in split_blocks(items):
            self._one_block(block, run_one)

    def _one_block(self, block: Sequence[tuple[T, int]], run_one: Callable[[T, int], None]) -> None:
        def work(node: ClusterNode, runs: list[tuple[T, int]]) -> None:
            self.pool.hold(node)
            try:
                for item in runs:
                    if self.cancel.is_set():
                        raise KeyboardInterrupt("sweep interrupted")
                    with self._lock:
                        self._local.executor = self._pinned(node)
                        try:
                            run_one(*item)
                        finally:
                            self._local.executor = None
            finally:
                self.pool.give_back(node, self.nodes)

        pool = cf.ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="bench-node")
        futures: list[cf.Future] = []
        try:
            futures = [pool.submit(work, node, runs) for node, runs in zip(self.nodes, self.assign(block)) if runs]
            pending = set(futures)
            while pending:  # a timed wait, so that Ctrl-C / SIGTERM reach this thread at once
                done, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_EXCEPTION)
                for fut in done:
                    fut.result()
        except BaseException:
            self.cancel.set()  # every thread stops its job (RayJobExecutor.execute) and runs nothing more
            for fut in futures:
                fut.cancel()
            pool.shutdown(wait=True)
            raise
        pool.shutdown(wait=True)
