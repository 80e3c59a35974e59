"""walk/classify.py: the one failover rule (its outcome tables run through the walker in
tests/walk/test_walker.py); Retry-After as a recipient must read it."""

from __future__ import annotations

import email.utils
import time

import pytest

from proxy.walk.classify import retry_after


def test_retry_after_in_the_asctime_form_is_read_as_gmt(monkeypatch):
    """RFC 9110 5.6.7: a recipient must accept asctime dates, which are GMT. parsedate_to_datetime
    gives a naive datetime for it (and for a -0000 zone), and .timestamp() reads that as local time:
    on a gateway whose TZ is east of UTC the hint is lost, west of it the target cools for 300 s."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # UTC+9
    time.tzset()
    try:
        now = 2_000_000_000.0
        when = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(now + 60))  # asctime, GMT by definition
        assert email.utils.parsedate_to_datetime(when).tzinfo is None
        assert retry_after({"retry-after": when}, now) == pytest.approx(60, abs=1)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
