"""A pytest plugin for running redis-py's own test suite against `zipcache serve`.

redis-py's tests skip what the server's INFO `redis_version` predates; ZipCache reports
7.0.0 (what most of its commands follow) but serves the hash commands of Redis 7.4 and
8.0 (field expiry, HGETEX, HSETEX, HGETDEL), so their tests are run as against 8.0.
"""

import pytest


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session):
    from tests import conftest

    conftest.REDIS_INFO["version"] = "8.0.0"
