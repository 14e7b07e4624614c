"""The backends shipped with the core: ``memory://`` and ``sqlite:///``.

Nothing in the core imports this package; it is reached only through the
``taskmill.backends`` entry points, exactly like a separately installed backend.
"""
