"""taskmill-mongo: MongoDB storage for taskmill on PyMongo's async API."""

from taskmill_mongo.storage import SCHEMA_VERSION, MongoStorage

__all__ = ["SCHEMA_VERSION", "MongoStorage"]
