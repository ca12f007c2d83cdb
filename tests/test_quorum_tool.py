"""kafka-metadata-quorum.sh describe --status on a one-controller cluster: the ClusterId line
holds the cluster's id whether the tool asks a broker (--bootstrap-server) or the controller
itself (--bootstrap-controller), as Kafka's tool does through DescribeCluster."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tools.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent


def status(*args: str) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-m", "tools.kafka_metadata_quorum", *args, "describe", "--status"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return dict(re.findall(r"^(\w+):[ \t]*(.*)$", out.stdout, re.M))


def test_status_names_the_cluster_id_from_a_broker_and_from_the_controller(cluster: Cluster):
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})  # kept: the result needs the handle
    cluster_id = admin.describe_cluster().result(30).cluster_id
    assert cluster_id
    via_broker = status("--bootstrap-server", cluster.bootstrap)
    via_controller = status("--bootstrap-controller", f"{cluster.host}:{cluster.controller_port}")
    assert via_broker["ClusterId"] == via_controller["ClusterId"] == cluster_id, (via_broker, via_controller)
    assert via_controller["CurrentVoters"] == f"[{cluster.controller_ids[0]}]"
