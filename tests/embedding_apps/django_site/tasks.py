"""The project's taskmill object, configured from the Django settings."""

from django.conf import settings
from taskmill import Taskmill

import reports

tm = Taskmill(settings.TASKMILL_URL)
reports.register(tm)
