"""An async view that enqueues a task on the worker's own taskmill object."""

import json

from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from django_site.tasks import tm


@require_POST
async def enqueue_report(request: HttpRequest) -> JsonResponse:
    task = await tm.enqueue("report", json.loads(request.body))
    return JsonResponse({"id": task.id}, status=201)
