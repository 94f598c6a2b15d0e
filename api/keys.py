"""The application's shared objects, by typed key."""

from aiohttp import ClientSession, web

from engine.link.remote import RemoteNode

NODE = web.AppKey("node", RemoteNode)
SETTINGS = web.AppKey("settings", object)
HTTP = web.AppKey("http", ClientSession)
