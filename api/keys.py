"""The application's shared objects, by typed key."""

from aiohttp import ClientSession, web

from engine.link.remote import RemoteNode

# This node's engine of group 0 (every node is a member of it): the catalog, the cluster's membership.
NODE = web.AppKey("node", RemoteNode)
# group id -> this node's engine of that Raft group (issue 24)
ENGINES = web.AppKey("engines", dict)
# the request routing over groups (api/groups.py: the catalog cache, the placement)
GROUPS = web.AppKey("groups", object)
SETTINGS = web.AppKey("settings", object)
HTTP = web.AppKey("http", ClientSession)
