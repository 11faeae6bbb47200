"""pytest plugin (entry point ``pytest11``): fixtures for testing code that uses pybk.

Kept cheap to import: it loads in every pytest run where pybk is installed, so heavy modules
are imported inside the fixtures.
"""

from __future__ import annotations
