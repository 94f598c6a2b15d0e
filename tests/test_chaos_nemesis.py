"""The chaos campaign's nemesis (chaos/nemesis.py) on a cluster it does not start: a disk fault
aimed at one Raft group, when none of the bad disks holds a replica of that group, is recorded as
skipped and the campaign goes on. A 5-node, 4-group campaign (seed 2229315927) once stopped there
with a KeyError, its verdicts never written. No node processes."""

import pytest

from chaos.disks import Disks
from chaos.nemesis import Fault, Nemesis
from raftq.local import LocalCluster


@pytest.mark.parametrize("kind", ["fsync-eio", "misdirected-write"])
def test_a_disk_fault_on_a_group_no_bad_disk_holds_is_skipped_not_a_crash(kind, tmp_path):
    cluster = LocalCluster.create(tmp_path / "cluster", 5, groups=4, replicas=3)
    nemesis = Nemesis(cluster, network=None, clocks=None, history=None, prober=None, admin=None,
                      disks=Disks(root=tmp_path / "cluster", bad=[], control=tmp_path / "control"))
    group = 1
    outsider = next(node for node in cluster.ids if node not in nemesis.placement.members(group))
    nemesis.disks.bad = [outsider]
    fault = Fault(kind, hold_s=1.0, gap_s=0.0,
                  params={"pick": 0.0, "many": 0.0, "leader": False, "group_pick": (group + 0.5) / 4, "count": 1})
    details: dict = {}
    getattr(nemesis, "_" + kind.replace("-", "_"))(1, fault, details)
    assert details["group"] == group
    assert details["victims"] == [outsider]
    assert details["skipped"] == "no bad disk holds a replica of the Raft group picked"
    assert "sync_failed" not in details and "hits" not in details
