"""The OpenAPI 3.1 document served at /v1/openapi.json, built from routes.ROUTES."""

import re

from .errors import STATUS
from .openapi_schemas import ERROR, NAME, SQS_ERROR

REASONS = {101: "Switching protocols", 200: "OK", 201: "Created", 202: "Accepted (buffered)",
           204: "No content", 302: "Found"}
PATH_PARAMS = {"account": {"type": "string", "pattern": "^[0-9]{12}$"}, "queue": NAME, "group": NAME, "node": NAME, "producer": {"type": "string", "minLength": 1}, "name": {"type": "string", "minLength": 1},
               "token": {"type": "string", "minLength": 1, "maxLength": 64},
               "access_key": {"type": "string", "pattern": "^[A-Za-z0-9]{16,128}$"}}
CODES_BY_STATUS: dict[int, list[str]] = {}
for _code, _status in STATUS.items():
    CODES_BY_STATUS.setdefault(_status, []).append(_code)


SQS_TYPES = ("application/x-amz-json-1.0", "text/xml")


def _sqs_responses(route) -> dict:
    """The SQS endpoint answers in the caller's protocol: JSON 1.0 or the query protocol's XML."""
    def content(json_schema: dict) -> dict:
        return {"application/x-amz-json-1.0": {"schema": json_schema}, "text/xml": {"schema": {"type": "string"}}}
    responses = {"200": {"description": "the action's result (docs/sqs.md)", "content": content({"type": "object"})}}
    for status in (400, 403, 404, 413, 503):
        responses[str(status)] = {"description": "an SQS error (docs/sqs.md)",
                                  "content": content({"$ref": "#/components/schemas/SqsError"})}
    if "{" in route.path:
        responses["404"]["description"] += "; or the router's not_found, for a path that is no queue URL"
        responses["404"]["content"]["application/json"] = {"schema": {"$ref": "#/components/schemas/Error"}}
    return responses


def _responses(route) -> dict:
    if route.action == "sigv4":
        return _sqs_responses(route)
    statuses = set(route.errors) | {400}
    if route.action is not None:
        statuses |= {401, 403}
    if route.body is not None:
        statuses |= {408, 413}
    if route.leader:
        statuses |= {307, 503}
    if "{" in route.path:
        statuses.add(404)
    responses = {str(s): {"description": REASONS.get(s, "")} for s in route.ok}
    for status in sorted(statuses):
        codes = ", ".join(CODES_BY_STATUS.get(status, ["bad_request"]))
        responses[str(status)] = {
            "description": f"error: {codes}",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return responses


def _operation(route) -> dict:
    op = {"summary": route.summary, "operationId": f"{route.method.lower()}{_camel(route.template)}",
          "x-raftq-action": "|".join(route.actions) if route.action is not None else "open",
          "security": [] if route.action is None else [{"sigv4" if route.action == "sigv4" else "bearer": []}],
          "responses": _responses(route)}
    params = [{"name": name, "in": "path", "required": True, "schema": PATH_PARAMS[name]}
              for name in re.findall(r"{(\w+)}", route.template)]
    params += [{"name": name, "in": "query", "required": False, "schema": schema} for name, schema in route.query]
    if params:
        op["parameters"] = params
    if route.body is not None:
        op["requestBody"] = {"required": route.body_required, "content": {
            "application/json": {"schema": route.body}}}
    return op


def _camel(path: str) -> str:
    return "".join(part.strip("{}").title().replace("_", "").replace(".", "")
                   for part in path.split("/") if part)


def document(routes, *, limits: dict) -> dict:
    paths: dict[str, dict] = {}
    for route in routes:
        paths.setdefault(route.template, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {"title": "raftq", "version": "1",
                 "description": "A Raft-replicated durable queue cluster. Limits of this node: "
                                + ", ".join(f"{k}={v}" for k, v in limits.items())},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "a token whose principal may do the action the "
                                                          "route names (x-raftq-action: one of them) on its "
                                                          "queue; cluster.toml's admin token may do all"},
                                "sigv4": {"type": "apiKey", "in": "header", "name": "Authorization",
                                          "description": "AWS Signature Version 4 by an SQS key: of [sqs] in "
                                                         "cluster.toml, or a principal's (docs/sqs.md)"}},
            "schemas": {"Error": ERROR, "SqsError": SQS_ERROR},
        },
    }
