"""``ray start`` for a test cluster of several nodes on this machine, every node on 127.0.0.1.

Ray turns a ``--node-ip-address`` of 127.0.0.1 into the machine's outward address
(``ray._private.services.resolve_ip_for_localhost``) unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, and
with that variable set ``ray start --address`` refuses to start a second node. This launcher keeps the
CLI's multi-node check as Ray ships it, answers 127.0.0.1 as this node's address, and sets the variable
for the processes the node starts (raylet, agents, workers), so that every node, agent and job of the
cluster is addressed as 127.0.0.1. Usage: ``python _ray_loopback.py start ...`` (the ``ray`` CLI's arguments).
"""

import os
import sys

import ray._private.services as services

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # the node's own processes: this node is 127.0.0.1
services.get_node_ip_address = lambda address=None: "127.0.0.1"

from ray.scripts.scripts import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
