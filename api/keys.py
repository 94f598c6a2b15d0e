"""The application's shared objects, by typed key."""

from aiohttp import ClientSession, web

from raftq.engine.link.remote import RemoteNode
from raftq.engine.placement import Placement

# group id -> the local engine of that group, one per group this node is a member of
ENGINES = web.AppKey("engines", dict)
# the members of every group, in order of preference for leadership (their
# HTTP addresses: any engine's view()["http"])
PLACEMENT = web.AppKey("placement", Placement)
# group 0's engine: every node is a member of group 0
NODE = web.AppKey("node", RemoteNode)
# the request routing over groups (api/groups.py: the catalog cache, the placement)
GROUPS = web.AppKey("groups", object)
SETTINGS = web.AppKey("settings", object)
# this node's disk state and the other nodes' (api/disk.py: the disk alarm)
DISK = web.AppKey("disk", object)
HTTP = web.AppKey("http", ClientSession)
# a request's key: its Raft group, once leader.route_to_leader has chosen it
GROUP = "raftq_group"
