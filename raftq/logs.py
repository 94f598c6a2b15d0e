"""A node's log: one JSON object per line on stderr, from every process of the node."""

import logging
import sys

import orjson
from aiohttp.http_exceptions import HttpProcessingError


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line, so logs can be shipped and queried as data."""

    def __init__(self, node_id: str):
        super().__init__()
        self.node_id = node_id
        self.group: int | None = None   # set in an engine process: the group it runs

    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                 "node": self.node_id, "pid": record.process, "logger": record.name, "msg": record.getMessage()}
        if self.group is not None:
            entry["group"] = self.group
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class MalformedRequestFilter(logging.Filter):
    """aiohttp answers a malformed request (bad header bytes, a broken request
    line) with 400 itself, then logs it as an error with a traceback: any
    client could fill the log that way. One line at debug level instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], HttpProcessingError):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.msg, record.args = "malformed request answered 400: %s", (record.exc_info[1],)
            record.exc_info = None
            return logging.getLogger().isEnabledFor(logging.DEBUG)
        return True


def setup_logging(node_id: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter(node_id))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.server").addFilter(MalformedRequestFilter())


def tag_group(group: int) -> None:
    """In an engine process: every line it logs names its group."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, JsonLogFormatter):
            handler.formatter.group = group
