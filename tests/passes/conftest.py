"""The kit (tests/support/backend_kits.py) of each framework, for the pass suites that run per backend."""
from __future__ import annotations

import pytest
from support.backend_kits import KITS


@pytest.fixture(scope="module", params=sorted(KITS))
def kit(request):
    kit = KITS[request.param]()
    kit.setup()
    yield kit
    kit.teardown()
