"""``ray start`` for a node of the tests' cluster, kept on 127.0.0.1: ``python ray_loopback.py
start ...`` runs Ray's own command line with two of its settings changed.

Ray (2.x) turns 127.0.0.1 and localhost into the machine's interface address wherever it
resolves an address (``services.resolve_ip_for_localhost``), unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (``ray_constants.ENABLE_RAY_CLUSTER``) says this is a
one-machine cluster; tests/ray_cluster.py sets that for every process of the cluster. But
``ray start --address`` then refuses to start a second node ("multi-node clusters are not
supported"): this wrapper lets it past that check, with the node's own address taken as
127.0.0.1, as ``--node-ip-address`` asks. The processes the node starts keep the variable, so
every connection of the cluster stays on 127.0.0.1.
"""

from __future__ import annotations

import sys

from ray._private import ray_constants, services


def _loopback(address: str | None = None) -> str:
    return "127.0.0.1"


if __name__ == "__main__":
    ray_constants.ENABLE_RAY_CLUSTER = True  # past the check; the addresses stay on loopback:
    services.get_node_ip_address = _loopback  # resolve_ip_for_localhost and the node's own IP
    from ray.scripts.scripts import main

    sys.argv[0] = "ray"
    sys.exit(main())
