"""Wrappers around transforms, one module per family (imported by name; `eqopt/__init__.py`
re-exports the public names)."""
