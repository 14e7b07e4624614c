"""Settings of a minimal Django project that runs a taskmill worker under ASGI."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "django_site.urls"
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
USE_TZ = True

TASKMILL_URL = os.environ.get("TASKMILL_URL", f"sqlite:///{BASE_DIR / 'tasks.db'}")
TASKMILL_SHUTDOWN_GRACE = 5.0  # seconds running tasks get to finish at shutdown
