"""taskmill-mysql: task storage in MySQL 8+ / MariaDB 10.6+ (aiomysql).

``Taskmill("mysql://user:password@host:3306/database")`` (or ``mariadb://``) finds
:class:`MySQLStorage` through the ``taskmill.backends`` entry points.
"""

from taskmill_mysql.schema import latest_version
from taskmill_mysql.storage import MySQLStorage

__all__ = ["MySQLStorage", "latest_version"]
