"""The application's shared objects, by typed key."""

from aiohttp import ClientSession, web

NODE = web.AppKey("node", object)
SETTINGS = web.AppKey("settings", object)
HTTP = web.AppKey("http", ClientSession)
