"""The dashboard (SPEC section 11): ``/ui`` of the service, in a browser.

:func:`create_dashboard` builds it for a :class:`~taskmill_http.Service`;
:func:`~taskmill_http.create_app` mounts it at ``/ui``. See docs/dashboard.md.
"""

from taskmill_http.dashboard.app import (
    CONTENT_SECURITY_POLICY,
    SESSION_COOKIE,
    Dashboard,
    create_dashboard,
)
from taskmill_http.tokens import SESSION_SECRET_ENV

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "SESSION_COOKIE",
    "SESSION_SECRET_ENV",
    "Dashboard",
    "create_dashboard",
]
