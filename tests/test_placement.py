"""engine/placement.py against its promises, for any cluster shape:
replicas spread within one, every group holds its members and group 0
every node, preferred leaders spread ⌈G/N⌉/⌊G/N⌋, and with any one node
down the first live preferences still spread within one (always where every
group has every node; in the shapes measured otherwise)."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from raftq.engine.placement import place

shapes = st.integers(1, 9).flatmap(
    lambda nodes: st.tuples(st.just(nodes), st.integers(1, 64), st.integers(1, nodes)))


def node_ids(count: int) -> list[str]:
    return [f"n{i + 1}" for i in range(count)]


@settings(max_examples=300, deadline=None)
@given(shapes)
def test_each_group_has_its_members_and_group_0_every_node(shape):
    count, groups, replicas = shape
    nodes = node_ids(count)
    placement = place(nodes, groups, replicas)
    assert len(placement.groups) == groups
    assert sorted(placement.members(0)) == sorted(nodes)
    for group in range(1, groups):
        members = placement.members(group)
        assert len(members) == replicas == len(set(members)) and set(members) <= set(nodes)


@settings(max_examples=300, deadline=None)
@given(shapes)
def test_replicas_spread_within_one(shape):
    count, groups, replicas = shape
    nodes = node_ids(count)
    held = place(nodes, groups, replicas).held(nodes)
    assert max(held.values()) - min(held.values()) <= 1, held


@settings(max_examples=300, deadline=None)
@given(shapes)
def test_preferred_leaders_spread_ceil_or_floor_of_groups_per_node(shape):
    count, groups, replicas = shape
    nodes = node_ids(count)
    leads = place(nodes, groups, replicas).leads(set(nodes))
    assert set(leads.values()) <= {groups // count, math.ceil(groups / count)}, leads
    assert sum(leads.values()) == groups


def spread_with_one_down(placement, nodes: list[str]) -> int:
    """The widest spread of first live preferences over the live nodes, any one node down."""
    widest = 0
    for down in nodes:
        leads = placement.leads(set(nodes) - {down})
        widest = max(widest, max(leads.values()) - min(leads.values()))
    return widest


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 9).flatmap(lambda nodes: st.tuples(st.just(nodes), st.integers(1, 64))))
def test_with_one_node_down_first_live_preferences_spread_within_one_when_groups_span_every_node(shape):
    count, groups = shape
    nodes = node_ids(count)
    assert spread_with_one_down(place(nodes, groups, count), nodes) <= 1


def test_with_one_node_down_first_live_preferences_spread_within_one_in_the_usual_shapes():
    """3 nodes with any replicas, 5 nodes with 3 replicas, up to 64 groups.
    Not 5 nodes, 3 replicas, 4 groups: one node leads none, and to take
    over from whichever node is lost it would have to hold a replica of
    every group, twice its share; there the spread with a node down is 2."""
    for count, replicas in [(3, 1), (3, 2), (3, 3), (5, 3)]:
        nodes = node_ids(count)
        for groups in range(1, 65):
            if (count, replicas, groups) == (5, 3, 4):
                continue
            assert spread_with_one_down(place(nodes, groups, replicas), nodes) <= 1, (count, replicas, groups)


def test_placement_is_the_same_on_every_node():
    nodes = node_ids(5)
    assert place(nodes, 8, 3) == place(list(nodes), 8, 3)


def test_a_bad_shape_is_refused():
    import pytest
    for args in [([], 1, 1), (["a", "a"], 1, 1), (["a"], 0, 1), (["a", "b"], 2, 3), (["a"], 1, 0)]:
        with pytest.raises(ValueError):
            place(*args)


def write_config(tmp_path, cluster_table: str, nodes: int = 3):
    from raftq.engine import config as cluster_config
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_table + "".join(
        f'[[nodes]]\nid = "n{i}"\nraft = "127.0.0.1:{7000 + i}"\nhttp = "127.0.0.1:{8000 + i}"\n'
        for i in range(1, nodes + 1)))
    path.chmod(0o600)
    return cluster_config.load(path)


def test_cluster_toml_without_groups_is_one_group_of_every_node(tmp_path):
    cfg = write_config(tmp_path, "", nodes=5)
    assert (cfg.groups, cfg.replicas, cfg.replicas_per_group) == (1, None, 3)
    assert "groups" not in cfg.to_toml() and "replicas" not in cfg.to_toml()
    assert write_config(tmp_path, "", nodes=2).replicas_per_group == 2   # 3, capped at the nodes


def test_cluster_toml_groups_and_replicas_round_trip(tmp_path):
    cfg = write_config(tmp_path, "[cluster]\ngroups = 4\nreplicas = 2\n")
    assert (cfg.groups, cfg.replicas_per_group) == (4, 2)
    (tmp_path / "again").mkdir()
    again = tmp_path / "again" / "cluster.toml"
    again.write_text(cfg.to_toml())
    from raftq.engine import config as cluster_config
    assert cluster_config.load(again) == cfg


def test_cluster_toml_refuses_a_bad_group_count_or_replica_count(tmp_path):
    import pytest

    from raftq.engine.config import ConfigError
    for table in ["groups = 0", "groups = 65", 'groups = "4"', "groups = true", "replicas = 0", "replicas = 4",
                  "shards = 2"]:
        with pytest.raises(ConfigError):
            write_config(tmp_path, f"[cluster]\n{table}\n")


def test_the_default_group_count_is_half_the_cores_and_at_least_one():
    from raftq.engine.config import default_groups
    assert [default_groups(cores) for cores in (1, 2, 3, 4, 16, 1000)] == [1, 1, 1, 2, 8, 64]
