"""``GET /openapi.json``: the OpenAPI 3.1 document of the service, built from the same
route table and body classes the app serves."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from taskmill_http.bodies import ErrorBody, json_schema
from taskmill_http.calls import Endpoint

_ERROR_TEXT = {
    400: "The body is not JSON",
    401: "No token, or an unknown one",
    403: "The token may not do this (another app, or an admin endpoint)",
    404: "No such task (or it belongs to another app)",
    409: "The task is not in a state that allows this",
    410: "The cursor continues from a task that was deleted since (list again without one)",
    413: "The body, or a list in it, is too large",
    422: "The request does not have the shape or values this endpoint takes",
    503: "The store cannot be reached",
}


def _version() -> str:
    try:
        return version("taskmill-http")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


def openapi_document(endpoints: Sequence[Endpoint]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``endpoints``."""
    components: dict[str, Any] = {}
    error_ref = json_schema(ErrorBody, components)
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        operation: dict[str, Any] = {
            "operationId": endpoint.operation_id,
            "summary": endpoint.summary,
        }
        if endpoint.description:
            operation["description"] = endpoint.description
        if endpoint.params:
            operation["parameters"] = [
                {
                    "name": p.name,
                    "in": p.where,
                    "required": p.where == "path",
                    "description": p.description,
                    "schema": p.schema,
                    **({"style": "form", "explode": True} if p.repeated else {}),
                }
                for p in endpoint.params
            ]
        if endpoint.body is not None:
            operation["requestBody"] = {
                "required": endpoint.body_required,
                "content": {
                    "application/json": {
                        "schema": json_schema(endpoint.body, components, closed=True)
                    }
                },
            }
        responses: dict[str, Any] = {}
        success: dict[str, Any] = {"description": endpoint.summary}
        if endpoint.returns is not None:
            schema = json_schema(endpoint.returns, components)
            success["content"] = {endpoint.media_type: {"schema": schema}}
        responses[str(endpoint.status)] = success
        statuses = set(endpoint.errors)
        if not endpoint.public:
            statuses |= {401, 503}
            if endpoint.admin_only:
                statuses.add(403)
        if endpoint.body is not None:
            statuses |= {400, 413, 422}
        if endpoint.params:
            statuses.add(422)
        for status in sorted(statuses):
            responses[str(status)] = {
                "description": _ERROR_TEXT[status],
                "content": {"application/json": {"schema": error_ref}},
            }
        operation["responses"] = responses
        if not endpoint.public:
            operation["security"] = [{"bearer": []}]
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = operation
    components_doc: dict[str, Any] = {
        "schemas": components,
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "taskmill service",
            "version": _version(),
            "description": "Task operations for other processes, scoped by bearer token "
            "(see docs/service.md).",
        },
        "paths": paths,
        "components": components_doc,
    }


def openapi_endpoint(endpoints: Sequence[Endpoint]) -> Endpoint:
    """The endpoint that serves the document of ``endpoints`` (and of itself)."""
    document: dict[str, Any] = {}

    async def openapi(call: Any) -> dict[str, Any]:
        return document

    endpoint = Endpoint(
        "GET",
        "/openapi.json",
        openapi,
        "This OpenAPI document",
        returns=dict[str, Any],
        public=True,
    )
    document.update(openapi_document([*endpoints, endpoint]))
    return endpoint
